package zctipc_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/zctipc"
)

// forgeInto puts raw, a record whose first word is its size, into the
// queue name as its next record, as a writer that lies would: a bytes
// record of that size is put, then overwritten in the ring (which starts
// 512 bytes into the queue's data: docs/format.md, "Queues").
func forgeInto(t *testing.T, name string, raw []byte) {
	t.Helper()
	q, err := queue.Attach(name)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	require.NoError(t, q.Put(&message.Record{Type: message.TypeBytes, Payload: make([]byte, len(raw)-16)}, time.Time{}))
	d := q.Segment().Data()
	size := binary.LittleEndian.Uint64(d[0:])
	tail := uint64(uint32(binary.LittleEndian.Uint64(d[96:])))
	for i := range raw {
		d[512+(tail-uint64(len(raw))+uint64(i))%size] = raw[i]
	}
}

// forgedInline is an inline record of one uint8 whose header claims
// ndesc descriptors.
func forgedInline(ndesc uint16) []byte {
	raw := make([]byte, 32)
	binary.LittleEndian.PutUint32(raw[0:], 32)
	raw[4] = message.TypeInline
	binary.LittleEndian.PutUint16(raw[6:], ndesc)
	binary.LittleEndian.PutUint32(raw[8:], 9)
	binary.LittleEndian.PutUint16(raw[16:], uint16(zctipc.Uint8))
	raw[24] = 7
	return raw
}

// Get of a record whose header asks for more views than any record that
// decodes (an inline record claiming every descriptor) takes it and says
// it is malformed, rather than grow its buffer and ask again for ever; a
// lie of another field is malformed too; the messages after them come.
func TestAPIGetOfForgedRecordsEnds(t *testing.T) {
	t.Parallel()
	q, err := zctipc.NewQueue("", 1<<16)
	require.NoError(t, err)
	defer q.Close()
	forgeInto(t, q.Name(), forgedInline(message.MaxDescriptors))
	forgeInto(t, q.Name(), forgedInline(1))
	lying := forgedInline(0)
	lying[18] = 0x80 // flags past the three a record has
	forgeInto(t, q.Name(), lying)
	forgeInto(t, q.Name(), forgedInline(0))
	require.NoError(t, q.PutBytes(context.Background(), []byte("after")))

	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := q.Get(ctx)
		cancel()
		require.ErrorIs(t, err, message.ErrMalformed)
	}
	m, err := q.Get(context.Background())
	require.NoError(t, err)
	require.NotNil(t, m.Tensor)
	require.Equal(t, zctipc.Uint8, m.Tensor.DType())
	require.Equal(t, []int64{}, m.Tensor.Shape(), "a scalar")
	b, err := m.Tensor.Bytes()
	require.NoError(t, err)
	require.Equal(t, []byte{7}, b)
	require.NoError(t, m.Tensor.Close())
	m, err = q.Get(context.Background())
	require.NoError(t, err)
	require.Equal(t, "after", string(m.Bytes))
}
