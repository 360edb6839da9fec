// Package queue is a many-producer, many-consumer queue of messages in a
// shared segment: a ring of variable-sized records (package message).
//
// # Crash safety
//
// Producers take one lock and consumers another (package lock), and a lock
// whose holder was killed is taken over. Every change is committed with a
// single 64-bit store that moves both a byte position and a message count:
// (puts << 32 | tail) for producers, (gets << 32 | head) for consumers. A
// producer killed before its commit leaves nothing behind; a consumer killed
// before its commit leaves the message for the next consumer, and one killed
// after it has taken the message with it. No other message is lost or
// duplicated, and no count drifts.
//
// # Waiting
//
// A full queue or an empty one is waited on with futexes on sequence words
// that every put (or get) bumps, after the waiter registered itself; a
// signal interrupts the wait so that the caller's host can run its handler.
//
// # Unbounded queues
//
// A queue made with CreateUnbounded has a ring of MaxCapacity bytes whose
// memory comes and goes with its messages: a producer reserves the pages
// of a chunk before it writes into it (offReserved says how far), and the
// consumer whose get leaves chunks behind gives their pages back, after its
// commit and before it lets go of the get lock (offGivenBack says how far).
// A producer writes only up to offGivenBack plus the ring size, so it never
// writes into a chunk whose pages are being given back. A consumer killed
// between its commit and giving back leaves pages in use (the next get
// gives them back); a producer killed after reserving leaves pages that the
// next one uses. So an unbounded queue holds as many messages as /dev/shm
// has room for, up to a gibibyte of pickled bytes, and uses the memory of
// the messages it holds. Ring version 2 (earlier libraries) reserves and
// gives back whole chunks; this library writes version 3.
//
// # The warm window
//
// A ring whose every record took fresh pages would pay for reserving and
// giving back a page for every page of messages that pass. So a version 3
// ring treats the first WarmWindow bytes of every lap (the window) apart:
// consumers never give their pages back as they pass, and a producer whose
// record does not fit in what is reserved of the window past the tail, when
// the queue is empty, writes a skip record and goes on at the start of the
// next lap. The window's pages are reserved as records first need them
// (offWindow says how far), and the consumer that empties the queue
// rewinds it: with the put lock, if it is free, it writes and crosses a
// skip record to the next lap, and gives back the window's pages past the
// largest record put since the last rewind (offWindowNeed). So an empty
// queue holds a page or two, and one whose messages pass one at a time
// keeps the pages of one message, reused put after put. Only when messages
// pile up does the ring go past the window, reserving pages in steps of
// plane.ReserveStep that consumers give back as they pass. A consumer crosses a
// skip record as it comes to it; so does a producer that finds no room
// because of one (the consumers took nothing since), so that the positions
// a skip passes over never make an unbounded queue full.
//
// # Records wrap
//
// A record is written at its byte position modulo the ring size and, when
// it runs past the end of the ring, goes on at offset 0, so the ring wastes
// no byte: any record up to the ring size fits an empty ring. Records are
// 8-byte multiples in a ring whose size is a power of two, so a record's
// first 8 bytes (its size and descriptor count) never straddle the end.
package queue
