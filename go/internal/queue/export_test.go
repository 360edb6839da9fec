package queue

import "github.com/zctipc/zctipc/go/internal/plane"

// PlaneOf returns q's view of its ring for the data plane's steps, for a
// test that puts records carrying sends of its own (plane.Send).
func PlaneOf(q *Queue) *plane.Queue { return q.p }
