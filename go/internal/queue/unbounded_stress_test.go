package queue_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/message"
	"github.com/zctipc/zctipc/go/internal/queue"
	"github.com/zctipc/zctipc/go/internal/testenv"
	"golang.org/x/sys/unix"
)

// stopID marks the message that tells a stress consumer to stop.
const stopID = 0xFFFFFFFF

// stressSize draws a message size: a few of 0 to 15 bytes (too small to
// say whose they are), most of a few KiB, some of hundreds, and a few of
// 1.5 to 2.5 MiB, past the warm window.
func stressSize(rng *rand.Rand) int {
	switch r := rng.IntN(100); {
	case r < 5:
		return rng.IntN(16)
	case r < 70:
		return 16 + rng.IntN(4<<10)
	case r < 94:
		return 16 + rng.IntN(256<<10)
	default:
		return 1536<<10 + rng.IntN(1<<20)
	}
}

// stressPayload is message seq of producer id, of size bytes: the two
// numbers, then bytes that depend on both.
func stressPayload(id, seq uint64, size int) []byte {
	p := make([]byte, size)
	if size < 16 {
		if size > 0 {
			p[0] = byte(id)
		}
		return p
	}
	binary.LittleEndian.PutUint64(p, id)
	binary.LittleEndian.PutUint64(p[8:], seq)
	for i := 16; i < size; i++ {
		p[i] = byte(uint64(i)*7 + seq + id)
	}
	return p
}

func init() {
	// ub-produce puts args[2] messages of producer args[1] into queue
	// args[0], of sizes drawn with seed args[3], and prints "sent seq"
	// after each.
	testenv.Helpers["ub-produce"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		id, _ := strconv.ParseUint(args[1], 10, 64)
		n, _ := strconv.Atoi(args[2])
		seed, _ := strconv.ParseUint(args[3], 10, 64)
		rng := rand.New(rand.NewPCG(seed, id))
		fmt.Println("ready")
		for seq := range uint64(n) {
			if err := q.Put(bytesRecord(stressPayload(id, seq, stressSize(rng))), time.Time{}); err != nil {
				return err
			}
			fmt.Printf("sent %d\n", seq)
		}
		return q.Close()
	}
	// ub-consume takes messages from queue args[0], one to three at a time,
	// checks each, and prints "got id seq", "tiny id" or "empty" for each,
	// or "BAD what" for one that is wrong; it stops at a stop message, saying
	// "stop n" for the n stop messages its last get took.
	testenv.Helpers["ub-consume"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(unix.Getpid()), 1))
		buf := make([]byte, 8<<20)
		last := map[uint64]uint64{}
		out := bufio.NewWriter(os.Stdout)
		fmt.Fprintln(out, "ready")
		if err := out.Flush(); err != nil {
			return err
		}
		for {
			n, filled, err := q.GetMany(buf, 1+rng.IntN(3), 0, time.Time{})
			if err != nil {
				fmt.Fprintf(out, "BAD GetMany: %v\n", err)
				return out.Flush()
			}
			if n == 0 {
				fmt.Fprintf(out, "BAD GetMany took no record and returned no error\n")
				return out.Flush()
			}
			stop := 0
			for at := 0; at < filled; {
				rec, size, err := message.NextRecord(buf[at:filled])
				if err != nil {
					fmt.Fprintf(out, "BAD record: %v\n", err)
					return out.Flush()
				}
				at += size
				p := rec.Payload
				switch {
				case len(p) == 0:
					fmt.Fprintln(out, "empty")
				case len(p) < 16:
					fmt.Fprintln(out, "tiny", p[0])
				default:
					id, seq := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
					if id == stopID {
						stop++
						continue
					}
					if string(p) != string(stressPayload(id, seq, len(p))) {
						fmt.Fprintf(out, "BAD bytes of message %d of producer %d\n", seq, id)
					}
					if prev, ok := last[id]; ok && seq <= prev {
						fmt.Fprintf(out, "BAD message %d of producer %d after %d\n", seq, id, prev)
					}
					last[id] = seq
					fmt.Fprintln(out, "got", id, seq)
				}
			}
			if stop > 0 {
				fmt.Fprintln(out, "stop", stop)
			}
			if err := out.Flush(); err != nil {
				return err
			}
			if stop > 0 {
				return q.Close()
			}
		}
	}
	// queue-hold-put-lock takes queue args[0]'s producers' lock, prints
	// "holding", and lets it go when a line comes on stdin.
	testenv.Helpers["queue-hold-put-lock"] = func(args []string) error {
		q, err := queue.Attach(args[0])
		if err != nil {
			return err
		}
		m := lockAt(q, 64)
		if _, err := m.Lock(time.Time{}); err != nil {
			return err
		}
		fmt.Println("holding")
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		if err := m.Unlock(); err != nil {
			return err
		}
		fmt.Println("released")
		return q.Close()
	}
}

// stressLog gathers what the stress consumers report.
type stressLog struct {
	mu     sync.Mutex
	got    map[[2]uint64]int
	tiny   map[uint64]int
	empty  int
	bad    []string
	cons   sync.WaitGroup
	killed int
}

// read reads h's reports until it exits; a live consumer's exit, and the
// stop messages it took, come on stops.
// The returned channel is closed once its output has ended: only then may
// the helper be waited for (Wait closes the pipe).
func (l *stressLog) read(h *testenv.Helper, stops chan<- int) <-chan struct{} {
	l.cons.Add(1)
	done := make(chan struct{})
	go func() {
		defer l.cons.Done()
		defer close(done)
		took := -1
		defer func() {
			if took >= 0 {
				stops <- took
			}
		}()
		for h.Out.Scan() {
			f := strings.Fields(h.Out.Text())
			l.mu.Lock()
			switch {
			case f[0] == "BAD":
				l.bad = append(l.bad, h.Out.Text())
			case f[0] == "stop":
				took, _ = strconv.Atoi(f[1])
			case f[0] == "empty":
				l.empty++
			case f[0] == "tiny":
				id, _ := strconv.ParseUint(f[1], 10, 64)
				l.tiny[id]++
			case f[0] == "got":
				id, _ := strconv.ParseUint(f[1], 10, 64)
				seq, _ := strconv.ParseUint(f[2], 10, 64)
				l.got[[2]uint64{id, seq}]++
			}
			l.mu.Unlock()
		}
	}()
	return done
}

// TestUnboundedQueueStressAcrossProcesses: producers and consumers in
// processes of their own share an unbounded queue whose positions start
// just before 2^32, with messages from 0 bytes to past 2 MiB. Consumers
// are SIGKILLed at random points of their gets (and replaced), a producer
// is SIGKILLed while it puts, and a process holding the producers' lock is
// SIGSTOPped while the consumers drain. Every message arrives at most once,
// whole and in order per producer; none is missing but those a killed
// process took with it; and, drained, the queue holds a few pages.
func TestUnboundedQueueStressAcrossProcesses(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	const producers, consumers, each = 4, 3, 250
	q, err := queue.CreateUnbounded("", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, q.Close()) }()
	if !q.Unbounded() {
		t.Skip("this kernel cannot reserve pages on demand")
	}
	startAt(t, q, 1<<32-5<<20)
	name := q.Segment().Name()
	log := &stressLog{got: map[[2]uint64]int{}, tiny: map[uint64]int{}}
	type consumer struct {
		*testenv.Helper
		read <-chan struct{}
	}
	var live []consumer
	stops := make(chan int, 100)
	startConsumer := func() {
		h := testenv.StartHelper(t, "ub-consume", name)
		require.Equal(t, "ready", h.ReadLine(t)) // it holds a count
		live = append(live, consumer{h, log.read(h, stops)})
	}
	for range consumers {
		startConsumer()
	}
	prods := make([]*testenv.Helper, producers)
	sent := make([]int, producers) // messages each producer said it put
	var sentMu sync.Mutex
	var prodDone sync.WaitGroup
	prodRead := make([]chan struct{}, producers)
	for i := range prods {
		prods[i] = testenv.StartHelper(t, "ub-produce", name, strconv.Itoa(i), strconv.Itoa(each), "28")
		require.Equal(t, "ready", prods[i].ReadLine(t))
		prodDone.Add(1)
		prodRead[i] = make(chan struct{})
		go func(i int, h *testenv.Helper) {
			defer prodDone.Done()
			defer close(prodRead[i])
			for h.Out.Scan() {
				sentMu.Lock()
				sent[i]++
				sentMu.Unlock()
			}
		}(i, prods[i])
	}
	kill := func(h *testenv.Helper, read <-chan struct{}) {
		require.NoError(t, h.Cmd.Process.Signal(unix.SIGKILL))
		<-read
		require.Error(t, h.Cmd.Wait())
		_, err := q.Segment().DropRef() // the killed process's count
		require.NoError(t, err)
	}

	rng := rand.New(rand.NewPCG(28, 28))
	producerKilled, stopped := false, false
	for round := 0; ; round++ {
		sentMu.Lock()
		total, sent0 := 0, sent[0]
		for _, n := range sent {
			total += n
		}
		sentMu.Unlock()
		if total >= (producers-1)*each+sent0 {
			break
		}
		time.Sleep(time.Duration(1+rng.IntN(15)) * time.Millisecond)
		switch {
		case !producerKilled && sent0 > each/4:
			kill(prods[0], prodRead[0]) // while it reserves or writes, or between puts
			producerKilled = true
		case !stopped && total > 2*each:
			// A live holder of the producers' lock, stopped: consumers drain
			// and cannot rewind; producers wait.
			h := testenv.StartHelper(t, "queue-hold-put-lock", name)
			require.Equal(t, "holding", h.ReadLine(t))
			require.NoError(t, h.Cmd.Process.Signal(unix.SIGSTOP))
			time.Sleep(50 * time.Millisecond)
			require.NoError(t, h.Cmd.Process.Signal(unix.SIGCONT))
			h.Send(t, "go")
			require.Equal(t, "released", h.ReadLine(t))
			h.Wait(t)
			stopped = true
		default:
			i := rng.IntN(len(live))
			kill(live[i].Helper, live[i].read)
			live = append(live[:i], live[i+1:]...)
			log.killed++
			startConsumer()
		}
	}
	prodDone.Wait()
	for _, h := range prods[1:] {
		h.Wait(t)
	}
	// One stop message for each consumer; one that took two in one get
	// leaves another waiting, which gets one more.
	for remaining, outstanding := len(live), 0; remaining > 0; remaining-- {
		for ; outstanding < remaining; outstanding++ {
			require.NoError(t, q.Put(bytesRecord(stressPayload(stopID, 0, 16)), time.Time{}))
		}
		select {
		case took := <-stops:
			outstanding -= took
		case <-time.After(time.Minute):
			t.Fatal("a consumer did not stop")
		}
	}
	log.cons.Wait()
	for _, h := range live {
		h.Wait(t)
	}

	require.Empty(t, log.bad)
	require.Equal(t, 0, qlen(t, q), "every message was taken")
	// The sizes each producer drew (the same draws): messages of fewer than
	// 16 bytes say only whose they are, and are counted.
	missing := 0
	for id := range uint64(producers) {
		rng := rand.New(rand.NewPCG(28, id))
		tinySent, empty := 0, 0
		for seq := range uint64(sent[id]) {
			if size := stressSize(rng); size < 16 {
				if size == 0 {
					empty++
				} else {
					tinySent++
				}
				continue
			}
			switch n := log.got[[2]uint64{id, seq}]; n {
			case 0:
				missing++
			case 1:
			default:
				t.Fatalf("message %d of producer %d taken %d times", seq, id, n)
			}
		}
		// A killed producer may have put one more than it said.
		require.LessOrEqual(t, log.tiny[id], tinySent+1, "tiny messages of producer %d", id)
		missing += max(0, tinySent-log.tiny[id])
		log.empty -= empty
	}
	require.LessOrEqual(t, log.empty, 1, "empty messages taken that were never put")
	missing += max(0, -log.empty)
	t.Logf("%d consumers killed; %d messages missing", log.killed, missing)
	require.LessOrEqual(t, missing, 3*log.killed, "only what killed consumers took is missing")
	require.Greater(t, len(log.got), (producers-1)*each*8/10)

	// A last pass through the window and the queue holds a few pages.
	buf := make([]byte, queue.WarmWindow)
	for _, size := range []int{queue.WarmWindow - 64<<10, 100} {
		require.NoError(t, q.Put(bytesRecord(make([]byte, size)), time.Now()))
		_, err := getInto(t, q, buf)
		require.NoError(t, err)
	}
	ringPages(t, q)
	// A page or two, and the pages that straddle the boundaries of the
	// chunks the run passed, at most one per chunk of the ring
	// (docs/format.md: consumers keep them).
	require.LessOrEqual(t, resident(t, q), int64(4<<12+ringSize/chunkSize<<12), "drained: words %v", ringWords(q))
}

// ringWords returns an unbounded queue's words, for a failure's message.
func ringWords(q *queue.Queue) string {
	d := q.Segment().Data()
	return fmt.Sprintf("tail %d head %d reserved %d given_back %d window %d window_need %d",
		uint32(binary.LittleEndian.Uint64(d[offTailWord:])), uint32(binary.LittleEndian.Uint64(d[offHeadWord:])),
		binary.LittleEndian.Uint32(d[offReserved:]), binary.LittleEndian.Uint32(d[offGivenBack:]),
		binary.LittleEndian.Uint32(d[offWindowWord:]), binary.LittleEndian.Uint32(d[offWindowNeedWord:]))
}
