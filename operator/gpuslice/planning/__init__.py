"""The pure core: inventories and policies in, desired objects out. No I/O."""
