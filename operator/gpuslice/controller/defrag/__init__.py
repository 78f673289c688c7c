"""The controller's defragmentation: it carries every recorded move out (``move``), starts moves in
Auto mode (``auto``) and counts them (``metrics``). What to move is decided in ``planning.defrag``."""
