package main

/*
#include "internal.h"
*/
import "C"

import (
	"errors"

	"github.com/zctipc/zctipc/go/internal/event"
)

var events = newTable[*event.Event]()

//export zct_event_create
func zct_event_create(name *C.zct_cchar, out *C.zct_handle, fullName *C.char, capacity C.uint64_t) C.int {
	return run(func() error {
		if out == nil || fullName == nil {
			return errNilArg
		}
		e, err := event.Create(goString(name))
		if err != nil {
			return err
		}
		var n C.uint64_t
		if err := copyOut(e.Segment().Name(), fullName, capacity, &n); err != nil {
			return errors.Join(err, e.Segment().Release())
		}
		e.SetInterruptible(true)
		*out = C.zct_handle(events.put(e))
		return nil
	})
}

//export zct_event_attach
func zct_event_attach(name *C.zct_cchar, out *C.zct_handle) C.int {
	return run(func() error {
		if name == nil || out == nil {
			return errNilArg
		}
		e, err := event.Attach(goString(name))
		if err != nil {
			return err
		}
		e.SetInterruptible(true)
		*out = C.zct_handle(events.put(e))
		return nil
	})
}

//export zct_event_close
func zct_event_close(h C.zct_handle) C.int {
	return closing(events, uint64(h), func(e *event.Event) error {
		return e.Close()
	})
}

//export zct_event_set
func zct_event_set(h C.zct_handle) C.int {
	return with(events, uint64(h), func(e *event.Event) error { return e.Set() })
}

//export zct_event_clear
func zct_event_clear(h C.zct_handle) C.int {
	return with(events, uint64(h), func(e *event.Event) error { return e.Clear() })
}

//export zct_event_is_set
func zct_event_is_set(h C.zct_handle, set *C.int32_t) C.int {
	return with(events, uint64(h), func(e *event.Event) error {
		if set == nil {
			return errNilArg
		}
		ok, err := e.IsSet()
		*set = boolInt(ok)
		return err
	})
}

//export zct_event_wait
func zct_event_wait(h C.zct_handle, timeoutMS C.int64_t, set *C.int32_t) C.int {
	return with(events, uint64(h), func(e *event.Event) error {
		if set == nil {
			return errNilArg
		}
		ok, err := e.Wait(deadline(timeoutMS))
		*set = boolInt(ok)
		return err
	})
}
