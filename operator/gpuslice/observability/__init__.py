"""Logs and metrics shared by the controller and the node agent."""
