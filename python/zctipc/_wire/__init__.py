"""The wire layer: how arrays, tensors, tables and CUDA tensors travel.

Buffers leave as exports and arrive as views (exports); whole objects are
pickled for queues with their buffers out of band (pickler), in records
framed as zctipc.h says (records); standard multiprocessing channels get
reducers (reducers); CPU torch tensors go as their storages, moved into
zctipc memory to be shared (storages); Arrow tables and torch CUDA tensors
have codecs of their own (tables, gpu); managers hand out copies (values).
It imports the core layer and nothing above it.
"""
