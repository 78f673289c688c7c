"""Defragmentation, pure: the planner that frees a GPU for a waiting pod by moving the fewest pods,
what it reads (facts, model), whether a requested move is its own, and the two marks a move leaves
while it runs: the node agent's taint and the tenancy rule's clause. The controller carries moves
out (``controller.defrag``); ``gpuslice defrag`` prints and requests them."""
