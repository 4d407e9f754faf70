"""Built-in adapters, one file per framework (installed as ``multidev.adapters``).

Each file implements :class:`multidev.protocol.Backend` with the same method names in the same
order, and imports its framework only when the adapter class is instantiated.
"""
