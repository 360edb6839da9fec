"""The core layer: what every other part of zctipc stands on.

The native library and its statuses (native), arguments (args), element
types (dtypes), array layout (layout), waiting (wait), memory owners and
the views over them (memory), pool buffers (pool), segments, shared tensors
and the census (segments), device memory (device), and the "zctipc" log
(log). It imports nothing of zctipc but the errors; the wire layer
(zctipc._wire) and the user API import it.
"""
