"""The words of a stream's shared memory that attack tests read and forge
(docs/format.md, "Streams"): the data word's sleepers, and each reader
slot's word and `armed` count."""

from zctipc._core import native

#: The data word's sleepers (u32), where the reader slots start, a slot's
#: size, and a slot's word (u64) and `armed` (u32) within it.
SLEEPERS, READERS_AT, READER_SIZE, WORD, ARMED = 388, 576, 64, 0, 56
#: Far above any count of real sleepers: a count here wrapped round.
WRAPPED = 1 << 20


def u32(stream, offset):
    return native.ffi().cast("uint32_t *", stream._memory + offset)


def u64(stream, offset):
    return native.ffi().cast("uint64_t *", stream._memory + offset)


def sleepers(stream):
    return u32(stream, SLEEPERS)[0]


def armed(stream, index):
    return u32(stream, READERS_AT + index * READER_SIZE + ARMED)


def slot_word(stream, index):
    return u64(stream, READERS_AT + index * READER_SIZE + WORD)
