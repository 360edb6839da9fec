"""CPython's own multiprocessing tests, run against zctipc.

The interpreter's ``test._test_multiprocessing`` (imported, never copied)
holds the tests that CPython runs under each start method. CPython turns its
``_TestX`` classes into ``WithProcessesTestX`` test cases with
``install_tests_in_module_dict``, whose mixin gives each one ``Queue``,
``Event``, ``Pool``, ``Process``... of ``multiprocessing``. This module does
the same with the objects of ``zctipc.get_context(method)``, for the start
methods zctipc supports (forkserver and spawn), so that every test below
exercises zctipc's queues, events, pool and contexts.

Note [the drop-in module]: many of the tests also call module-level names
(``multiprocessing.Pool(2)``, ``multiprocessing.SimpleQueue()``,
``multiprocessing.get_context('spawn')``). In the test module, the global
``multiprocessing`` is replaced by what ``import zctipc as multiprocessing``
gives a program: every name zctipc has in place of one of multiprocessing's
(the context.MULTIPROCESSING_NAMES, and the submodules zctipc stands in for:
``pool``, ``queues``, ``connection``...) is zctipc's, and what zctipc lacks
(``process``, ``dummy``, ``heap``...) stays multiprocessing's, so the
harness's own bookkeeping (``multiprocessing.process._dangling``) works. It is
replaced when this module is imported, so that child processes, which import
this module to find the test classes, see the same names as the parent. The
start method is set as CPython's setUpModule sets it, through that module:
with zctipc's set_start_method, never with multiprocessing's.

SKIPS lists the tests that do not run, each with its reason: tests that fork
on purpose, that inspect a CPython private with no meaning for zctipc, or
that check a behaviour zctipc changes on purpose. Every other test runs and
its failures are reported as failures.

Run it with ``python -m tests.python.conformance.cpython_mp [METHOD...]``
from the repository root, or by path; ``-k TEXT`` runs only the tests whose
id contains TEXT. It prints, for each start method, how many tests ran,
passed, failed, raised and were skipped (with the reasons), then one line
per start method starting with ``CONFORMANCE``, which
tests/python/test_cpython_conformance.py reads. The exit status is 0 when no
test failed or raised, 1 otherwise, 2 when the interpreter has no ``test``
package.
"""

import argparse
import collections
import faulthandler
import gc
import multiprocessing
import multiprocessing.process
import multiprocessing.util
import signal
import sys
import threading
import time
import types
import unittest

import zctipc
from zctipc import context as zctipc_context

try:
    from test import _test_multiprocessing as cpython
except (ImportError, unittest.SkipTest) as exc:  # SkipTest: no _multiprocessing, broken sem_open
    cpython = None
    MISSING = (
        f"CPython's multiprocessing tests cannot be imported by {sys.executable} ({type(exc).__name__}: {exc}); "
        "this interpreter lacks the standard library's `test` package (Debian/Ubuntu: the "
        "libpythonX.Y-testsuite package; a python.org or pyenv build has it), so zctipc's conformance "
        "with multiprocessing was NOT checked"
    )
else:
    MISSING = None

START_METHODS = ("forkserver", "spawn")

#: The CPython test classes that run, by their name in test._test_multiprocessing.
#: ``_TestX`` classes (BaseTestCase) get the context's objects as attributes;
#: the others call the module-level names (Note [the drop-in module]).
#: _TestProcess is in because its tests pass zctipc's queues to children;
#: _TestLock, although Lock is multiprocessing's, because it is cheap and
#: checks that the context hands out working locks.
#:
#: Left out, to keep the run short and because they test what zctipc leaves
#: to multiprocessing whatever the context: _TestSubclassingProcess,
#: _TestSemaphore, _TestCondition, _TestBarrier, _TestValue, _TestArray,
#: _TestSharedCTypes, _TestHeap, _TestFinalize, _TestLogging (multiprocessing's
#: own objects); _TestContainers, _TestMyManager, _TestRemoteManager,
#: _TestManagerRestart, TestSyncManagerTypes (a manager's queues and events
#: are the manager's); _TestConnection, _TestListener, _TestListenerClient,
#: _TestPoll, _TestPollEintr, _TestPicklingConnections, TestWait,
#: TestTimeouts, TestIgnoreEINTR, TestInvalidFamily (connections and
#: sockets); _TestSharedMemory, TestResourceTracker, TestNamedResource
#: (shared_memory and resource_tracker internals); TestPoolNotLeakOnFailure
#: (a Pool with a mock context); TestNoForkBomb, TestCloseFds, TestFlags,
#: MiscTestCase, _TestImportStar, SemLockTests (fresh interpreters with
#: multiprocessing itself, or its module layout).
CLASSES = (
    "_TestProcess",
    "_TestQueue",
    "TestSimpleQueue",
    "_TestEvent",
    "_TestLock",
    "_TestPool",
    "_TestPoolWorkerErrors",
    "_TestPoolWorkerLifetime",
    "TestInitializers",
    "TestStartMethod",
    "TestStdinBadfiledescriptor",
)

#: Tests that do not run: "CPythonClass.test_method" -> why.
# The Python whose test suite SKIPS was written against: there, a skip of a
# test that does not exist is an error; other versions may lack some.
SKIPS_WRITTEN_FOR = (3, 11)
SKIPS = {
    "_TestQueue.test_queue_feeder_donot_stop_onexc": (
        "deliberate difference: zctipc's put() of an unpicklable object raises in the caller; "
        "multiprocessing's feeder thread logs the error and drops the object"
    ),
    "_TestQueue.test_queue_feeder_on_queue_feeder_error": (
        "CPython private: the _on_queue_feeder_error hook of the feeder thread of a subclass of "
        "multiprocessing.queues.Queue; zctipc has no feeder thread and is not involved"
    ),
    "TestStartMethod.test_get_all": (
        "deliberate difference: zctipc offers forkserver and spawn only (a Go runtime does not "
        "survive fork), the test requires 'fork' in get_all_start_methods()"
    ),
    "TestStartMethod.test_mixed_startmethod": (
        "forks on purpose: makes a Queue of the 'fork' context, which zctipc refuses"
    ),
}

#: Longest a single test may take before it is interrupted and counted as
#: an error, so that one hung test does not hang the run.
TEST_TIMEOUT = 120
#: Longest the whole run may take before it dumps every thread's stack and
#: exits (a hang where SIGALRM cannot reach, in setUpClass say); under the
#: pytest test's limit, so that the stacks reach its report.
RUN_TIMEOUT = 540


class _DropIn(types.ModuleType):
    """The module ``import zctipc as multiprocessing`` gives a program,
    with multiprocessing's for what zctipc lacks (Note [the drop-in module])."""

    def __getattr__(self, name):
        if hasattr(multiprocessing, name) and hasattr(zctipc, name):
            return getattr(zctipc, name)
        return getattr(multiprocessing, name)


def drop_in_module():
    module = _DropIn("multiprocessing", "zctipc as multiprocessing (zctipc's conformance harness)")
    for name in zctipc_context.MULTIPROCESSING_NAMES:
        setattr(module, name, getattr(zctipc, name))
    return module


def processes_mixin(method):
    """CPython's ProcessesMixin with the objects of zctipc's context."""
    ctx = zctipc.get_context(method)
    attrs = {"TYPE": "processes", "__module__": __name__}
    for name, value in vars(cpython.ProcessesMixin).items():
        if name.startswith("__") or name == "TYPE":
            continue
        if name == "Process":
            value = ctx.Process
        elif hasattr(ctx, name):
            value = staticmethod(getattr(ctx, name))
        attrs[name] = value  # what the context lacks (connection) stays multiprocessing's
    attrs["SimpleQueue"] = staticmethod(ctx.SimpleQueue)
    return type(f"{method.capitalize()}ProcessesMixin", (cpython.ProcessesMixin,), attrs)


def make_cases(method):
    """The test case classes for one start method, named as
    install_tests_in_module_dict names them with the method in front
    (ForkserverWithProcessesTestQueue, SpawnTestStartMethod)."""
    mixin = processes_mixin(method)
    cases = []
    for name in CLASSES:
        base = getattr(cpython, name)
        if issubclass(base, cpython.BaseTestCase):
            if "processes" not in base.ALLOWED_TYPES:
                raise ValueError(f"{name} does not run with processes")
            newname = f"{method.capitalize()}WithProcesses{name[1:]}"
            bases = (base, mixin, unittest.TestCase)
        else:
            newname = f"{method.capitalize()}{name}"
            bases = (base,)
        attrs = {"__module__": __name__, "__qualname__": newname}
        for key, reason in SKIPS.items():
            cls_name, _, test = key.partition(".")
            if cls_name == name:
                if not callable(getattr(base, test, None)):
                    if sys.version_info[:2] == SKIPS_WRITTEN_FOR:
                        raise ValueError(f"SKIPS names {key}, which test._test_multiprocessing does not have")
                    continue  # a test this Python's suite does not have (yet, or any more)
                attrs[test] = unittest.skip(reason)(getattr(base, test))
        cases.append(type(newname, bases, attrs))
    return cases


if cpython is not None:
    # Note [the drop-in module].
    cpython.multiprocessing = drop_in_module()
    # The classes are module attributes so that child processes find them
    # by name when they unpickle a test's bound method (cls._test_put).
    CASES = {method: make_cases(method) for method in START_METHODS}
    globals().update({cls.__name__: cls for cases in CASES.values() for cls in cases})


# -- what CPython's setUpModule and tearDownModule do, for one start method --


def start_suite(method):
    """Set up as CPython's setUpModule does; return what finish_suite needs."""
    mp = cpython.multiprocessing
    # The fork server imports zctipc and CPython's tests once, not in every child.
    mp.set_forkserver_preload(["__main__", "zctipc", "test._test_multiprocessing"])
    multiprocessing.process._cleanup()
    state = {
        "dangling": (multiprocessing.process._dangling.copy(), threading._dangling.copy()),
        "old": mp.get_start_method(allow_none=True),
    }
    mp.set_start_method(method, force=True)
    multiprocessing.util.get_temp_dir()
    multiprocessing.util.get_logger().setLevel(cpython.LOG_LEVEL)
    return state


def finish_suite(state):
    """Tear down as CPython's tearDownModule does; return the processes and
    threads the suite left behind."""
    gc.collect()
    cpython.multiprocessing.set_start_method(state["old"], force=True)
    processes = set(multiprocessing.process._dangling) - set(state["dangling"][0])
    threads = set(threading._dangling) - set(state["dangling"][1])
    if processes or threads:
        time.sleep(0.5)  # as CPython: time for the children to finish
    return processes, threads


# -- running ------------------------------------------------------------------


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout(f"the test ran longer than {TEST_TIMEOUT} s and was interrupted")


class _Result(unittest.TextTestResult):
    """TextTestResult that interrupts a test running longer than
    TEST_TIMEOUT, and times each test."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = {}

    def startTest(self, test):
        self._started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
        super().startTest(test)

    def stopTest(self, test):
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.seconds[cpython_id(test)] = time.monotonic() - self._started
        super().stopTest(test)


def cpython_id(test):
    """ "CPythonClass.test_method" of a test of this module."""
    cls = type(test)
    for base in cls.__mro__[1:]:
        if base.__module__ == cpython.__name__ and base.__name__ in CLASSES:
            return f"{base.__name__}.{test._testMethodName}"
    return test.id()


def load(method, keyword=None):
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for cls in CASES[method]:
        for test in loader.loadTestsFromTestCase(cls):
            if keyword is None or keyword in test.id():
                suite.addTest(test)
    return suite


def _first_line(trace):
    """The first line of the exception that a formatted traceback ends with."""
    lines = trace.strip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    i = frames[-1] + 1 if frames else 0
    while i < len(lines) and lines[i].startswith(" "):
        i += 1  # the frame's source line and its ^^^ markers
    return lines[i] if i < len(lines) else trace.strip()[-200:]


def run_method(method, keyword=None, stream=sys.stderr):
    """Run the suite of one start method; return its counts and lists."""
    suite = load(method, keyword)
    state = start_suite(method)
    started = time.monotonic()
    try:
        runner = unittest.TextTestRunner(stream=stream, verbosity=2, resultclass=_Result)
        result = runner.run(suite)
    finally:
        processes, threads = finish_suite(state)
    failed = [(t, tb) for t, tb in result.failures] + [(t, "unexpected success") for t in result.unexpectedSuccesses]
    skipped = [(t, reason) for t, reason in result.skipped]
    ran = result.testsRun
    return {
        "method": method,
        "ran": ran,
        "passed": ran - len(failed) - len(result.errors) - len(skipped) - len(result.expectedFailures),
        "failed": failed,
        "errors": list(result.errors),
        "skipped": skipped,
        "seconds": time.monotonic() - started,
        "slowest": sorted(result.seconds.items(), key=lambda kv: -kv[1])[:5],
        "dangling": (processes, threads),
    }


def _name(test):
    # setUpClass failures are _ErrorHolder objects, with a description only.
    return cpython_id(test) if isinstance(test, unittest.TestCase) else str(test)


def report(outcome, out=sys.stdout):
    m = outcome["method"]
    print(
        f"\n== {m}: ran {outcome['ran']}, passed {outcome['passed']}, failed {len(outcome['failed'])}, "
        f"errors {len(outcome['errors'])}, skipped {len(outcome['skipped'])} ({outcome['seconds']:.1f} s)",
        file=out,
    )
    for label, items in (("FAILED", outcome["failed"]), ("ERROR", outcome["errors"])):
        for test, trace in items:
            print(f"  {label} {_name(test)}: {_first_line(trace)}", file=out)
    for test, reason in outcome["skipped"]:
        key = _name(test)
        origin = "SKIPS" if key in SKIPS else "skipped by the CPython test"
        print(f"  SKIPPED {key} [{origin}]: {reason}", file=out)
    slowest = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in outcome["slowest"])
    print(f"  slowest: {slowest}", file=out)
    processes, threads = outcome["dangling"]
    if processes or threads:
        # As CPython's tearDownModule, a warning only.
        kinds = collections.Counter(t.name.split(" of ")[0] for t in threads)
        print(
            f"  warning: the suite left {len(processes)} processes and {len(threads)} threads running "
            f"(threads: {dict(kinds)})",
            file=out,
        )


def summary_line(outcome):
    return (
        f"CONFORMANCE {outcome['method']} ran={outcome['ran']} passed={outcome['passed']} "
        f"failed={len(outcome['failed'])} errors={len(outcome['errors'])} skipped={len(outcome['skipped'])} "
        f"seconds={outcome['seconds']:.1f}"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run CPython's multiprocessing tests against zctipc.")
    parser.add_argument(
        "methods",
        nargs="*",
        metavar="METHOD",
        help=f"start methods to run: {' or '.join(START_METHODS)} (default: both)",
    )
    parser.add_argument("-k", dest="keyword", help="run only the tests whose id contains this text")
    args = parser.parse_args(argv)
    for method in args.methods:
        if method not in START_METHODS:
            parser.error(f"unknown start method {method!r}: use {' or '.join(START_METHODS)}")
    if cpython is None:
        print(f"zctipc conformance: {MISSING}", file=sys.stderr)
        return 2
    # Before zctipc loads Go, whose runtime then forwards SIGALRM to Python.
    signal.signal(signal.SIGALRM, _alarm)
    faulthandler.dump_traceback_later(RUN_TIMEOUT, exit=True)
    outcomes = [run_method(method, args.keyword) for method in args.methods or START_METHODS]
    faulthandler.cancel_dump_traceback_later()
    sys.stderr.flush()
    for outcome in outcomes:
        report(outcome)
    print()
    for outcome in outcomes:
        print(summary_line(outcome))
    sys.stdout.flush()
    multiprocessing.util._cleanup_tests()  # stops the fork server, as CPython's last tearDownModule
    return 0 if all(not o["failed"] and not o["errors"] for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
