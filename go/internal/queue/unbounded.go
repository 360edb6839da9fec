package queue

// Note [threat model of the ring words]: every process of the user that
// attached the queue reads and writes its words (tail, head, reserved,
// given_back, window, window_need) and its ring, and any of them may be
// killed between two stores. Those words are trusted to have been written
// by this protocol: a process that forges them can lose or corrupt
// messages, as it could by writing the ring. What must never happen
// between processes that follow it, killed or not: a page written before
// it was reserved (a SIGBUS on a full /dev/shm), a page that holds a
// message given back, a message lost or taken twice. Forged values are
// bounded where that costs nothing: window is read as at most WarmWindow,
// reserved further than a ring from the tail is reset, a record or skip
// whose size cannot be right is reported as corrupt, never followed out of
// the ring. Head and tail are read once into locals and checked (sound)
// before the ring is read or written at them: off the 8-byte grid, or more
// than a ring apart, they are reported as corrupt (a forged position near
// the ring's end used to index past it). A given_back ahead of head's
// chunk or more than a ring behind it is not followed: nothing is given
// back, so a forged one costs memory, never a message (it used to give
// back the pages of the whole ring, messages and all). What stays trusted:
// reserved and window within their bounds, which say that pages are
// reserved; a forged one lets a put write a page never reserved, which on
// a full /dev/shm faults as a truncated file does (the C ABI turns that
// into ZCT_E_CORRUPT).
//
// The steps that follow this protocol are the data plane's (package plane,
// queue.c): reserving pages before a record is written, giving them back
// behind the consumers, catching up after a consumer killed between its
// commit and giving back.
//
// A put brings an unbounded queue's reserved position up to the committed
// tail (settle_reserved there), under the put lock, before it writes
// anything.
//
// Positions are 32-bit and wrap every four laps, so two of them can be
// compared only while they are less than 2^31 apart. A skip to the next
// lap moves the tail by up to a ring without reserving anything, so the
// reserved position, left where it was, falls a lap behind with every skip:
// two skips later its comparison with the tail says it is ahead, and a
// producer writes pages it never reserved. Kept at the committed tail or
// ahead of it, it stays within a ring of the tail (a put moves the tail by
// a ring at most, and reserves no further than a ring past given_back), so
// every comparison of it is sound. It may then claim positions before the
// tail that were skipped and never reserved: none is written again before
// it is a lap further on. A value further than a ring from the tail either
// way is one that an earlier library let fall behind: it is set to tail.
