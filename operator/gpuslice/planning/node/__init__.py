"""The node agent's planning (pure): a node's pool of devices from its GPUs and the policies that
select it, kept safe for what claims hold, and the states of GPUs only the agent sees."""
