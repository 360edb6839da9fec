"""zctipc's log: records of the standard library's ``logging``, from the
logger named "zctipc".

At DEBUG it says what a process does with shared memory, never once per
message: the segments it makes, attaches and lets go of, its pool's arenas
(each one added, and trims), its queues, the cleanup daemon it joins (or
why not), the start method zctipc chose for multiprocessing (Note [the
fork default] in zctipc.context), and arrays going in band for want of
room (when that starts and when it ends). Each record carries the numbers
and names as arguments, formatted only when a handler takes it.

The logger has a NullHandler, as a library's should: a program sees the
records once it configures logging (``logging.basicConfig(level=
logging.DEBUG)``, or a handler and level on ``logging.getLogger("zctipc")``).
``ZCTIPC_LOG=debug`` (or info, warning, error, a level number) gives the
logger that level and a handler of its own on stderr, from the moment the
package is imported, in every process whose environment has it (the
children a program starts inherit it); a record that the program's own
logging takes goes there instead (Note [each record once]).

Note [a log that costs nothing unasked]: importing ``logging`` costs a few
milliseconds, and ``import zctipc`` imports nothing it does not need (Note
[a lazy package] in zctipc), so this module does not import it: a program
that has not imported ``logging`` has configured no handler and no level,
and nothing could take a record. Once something imports it (the program,
torch, ZCTIPC_LOG), ``active`` is the logger (Note [meeting a module on
import] in zctipc._core.lazy). Every record is made behind ``enabled()``,
and on a path taken per message (a pool allocation) the check is all there
is: ``active is not None``, and then ``Logger.isEnabledFor``'s cached answer.
"""

import os
import sys

from . import lazy

TYPE_CHECKING = False  # Note [types without typing] in zctipc._core.native
if TYPE_CHECKING:
    import logging

LOG_ENV = "ZCTIPC_LOG"
NAME = "zctipc"
DEBUG = 10  # logging.DEBUG, without importing logging

#: The "zctipc" logger once logging is imported, else None.
active: "logging.Logger | None" = None


def logger() -> "logging.Logger":
    """The "zctipc" logger, with its NullHandler (imports logging)."""
    global active
    if active is None:
        import logging

        log = logging.getLogger(NAME)
        if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
            log.addHandler(logging.NullHandler())
        active = log
    return active


lazy.when_imported("logging", logger)


def enabled(level: int = DEBUG) -> bool:
    """Whether a record of level would be handled (Note [a log that costs
    nothing unasked])."""
    log = active
    return log is not None and log.isEnabledFor(level)


def debug(message: str, *args: object) -> None:
    """A DEBUG record of message % args, when one would be handled."""
    if enabled(DEBUG):
        logger().debug(message, *args)


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50}
_FORMAT = "zctipc[%(process)d] %(levelname)s: %(message)s"
_stderr: "logging.Handler | None" = None


# Note [a level that is no level]: ZCTIPC_LOG is read as zctipc is
# imported, so a value that names no level is said in one line on stderr,
# as the interpreter says of a -W option it cannot read, and not with a
# warning: under ``python -W error`` a warning would be raised, and fail
# the import of every program (and child) whose environment has it.


def configure_from_environment() -> None:
    """Give the logger the level ZCTIPC_LOG names and a handler on stderr
    at that level (once per process). A value that names no level is said
    on stderr (Note [a level that is no level]), and logs nothing."""
    global _stderr
    value = os.environ.get(LOG_ENV, "").strip()
    if not value or _stderr is not None:
        return
    level = _LEVELS.get(value.lower())
    if level is None and value.isascii() and value.isdigit():
        level = int(value)
    if level is None:
        if sys.stderr is not None:
            print(
                f"zctipc: {LOG_ENV}={value!r} names no level (debug, info, warning, error, critical, or a "
                "number): zctipc logs nothing to stderr",
                file=sys.stderr,
            )
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_unclaimed)
    log = logger()
    log.addHandler(handler)
    log.setLevel(level)
    _stderr = handler


# Note [each record once]: ZCTIPC_LOG's handler is for a program that has
# not configured logging. One that has (logging.basicConfig, or a handler
# of its own on "zctipc", before or after the import) already takes the
# records that propagate to its handlers, and would see each of them twice
# on stderr, in two formats, were this handler to write them too. So it
# writes only the records that no other handler takes: where the program's
# logging goes (a file, say) zctipc's records go with it, once.


def _unclaimed(record: "logging.LogRecord") -> bool:
    """Whether no handler but ZCTIPC_LOG's takes record (Note [each record
    once])."""
    import logging

    log: logging.Logger | None = active
    while log is not None:
        for h in log.handlers:
            if h is not _stderr and not isinstance(h, logging.NullHandler) and record.levelno >= h.level:
                return False
        log = log.parent if log.propagate else None
    return True
