"""The public API: every name a release offered is still offered, where it
was. The lists are the API as it stood before the package was split into
layers; names may be added, never removed."""

import importlib

import pytest

import zctipc

PACKAGE = """
Array AuthenticationError Barrier BoundedSemaphore BufferTooShort Condition CorruptHeader CorruptTable CudaError
CudaOutOfMemory CudaUnavailable DEFAULT_MAX_BYTES DaemonUnavailable Event ForkedProcessError HandleClosed
IncompatibleVersion InvalidArgument JoinableQueue LibraryPoisoned Lock Manager NotAZctipcSegment OutOfSharedMemory
PermissionDenied Pipe Pipeline PipelineError Pool PoolStats Process ProcessError Queue RLock RawArray RawValue
SegmentExists SegmentInfo SegmentNotFound Semaphore SharedTensor SimpleQueue Stream StreamBusy StreamEnded
StreamReader StreamWriter TableHandle TimeoutError UnsupportedDtype Value ZctipcError ZctipcOSError active_children
attach_ref attach_shared_tensor attach_table cleanup_all_segments collect_garbage cpu_count create_shared_tensor
current_process daemon_status empty freeze_support get_all_sharing_strategies get_all_start_methods get_context
get_logger get_sharing_strategy get_start_method init_reductions init_torch_reductions is_shared
list_active_segments list_segments log_to_stderr parent_process pool_stats set_forkserver_preload set_pool_limit
set_sharing_strategy set_start_method share share_table
""".split()

SUBMODULES = {
    "zctipc.cuda": "CudaTensor device_count empty ipc_opens is_available unavailable_reason",
    "zctipc.arrow": "CorruptTable TableHandle attach_table share_table",
    "zctipc.streams": "Event Stream StreamReader StreamWriter",
    "zctipc.queues": "DEFAULT_MAX_BYTES JoinableQueue Queue SimpleQueue",
    "zctipc.context": "DEFAULT_START_METHOD DefaultContext ForkServerContext SpawnContext get_context",
    "zctipc.tensor": "SegmentInfo SharedTensor attach_ref attach_shared_tensor cleanup_all_segments "
    "create_shared_tensor list_segments share",
    "zctipc.pipeline": "Pipeline PipelineError",
    "zctipc.spawning": "ProcessContext ProcessException ProcessExitedException ProcessRaisedException SpawnContext "
    "spawn start_processes",
}


def test_the_package_offers_every_name_it_offered():
    assert len(PACKAGE) == 85
    missing = sorted(set(PACKAGE) - set(zctipc.__all__))
    assert not missing, f"public names removed: {missing}"
    for name in zctipc.__all__:
        assert hasattr(zctipc, name), f"zctipc.__all__ names {name}, which zctipc lacks"


def test_the_package_offers_every_name_multiprocessing_offers():
    import multiprocessing

    missing = sorted(set(multiprocessing.__all__) - set(zctipc.__all__))
    assert not missing, f"import zctipc as multiprocessing lacks {missing}"


@pytest.mark.parametrize("module", sorted(SUBMODULES))
def test_each_public_module_offers_every_name_it_offered(module):
    mod = importlib.import_module(module)
    missing = sorted(set(SUBMODULES[module].split()) - set(mod.__all__))
    assert not missing, f"{module} lost {missing}"
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.__all__ names {name}, which it lacks"


def test_every_exception_lives_in_errors():
    for name in zctipc.__all__:
        obj = getattr(zctipc, name)
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__.startswith("zctipc"):
            assert obj.__module__ == "zctipc.errors", f"{name} is defined in {obj.__module__}"


def test_event_is_one_class_wherever_it_is_imported_from():
    from zctipc.events import Event
    from zctipc.streams import Event as StreamsEvent

    assert zctipc.Event is Event is StreamsEvent


def test_the_package_says_where_each_name_lives():
    # Note [a lazy package]: the package finds its names in the modules
    # that define them, by a table kept beside their __all__ lists.
    from zctipc import context, errors

    for module, names in zctipc._EXPORTS.items():
        names = set(names.split())
        if module == "context":
            assert names == set(context.MULTIPROCESSING_NAMES) | {"reducer"}
            continue
        mod = importlib.import_module(f"zctipc.{module}")
        assert all(hasattr(mod, name) for name in names), f"zctipc.{module} lacks one of {sorted(names)}"
        if module in ("arrow", "buffers", "pipeline", "spawning", "strategy", "streams", "tensor"):  # all their names
            offered = set(mod.__all__)
            assert offered - names <= set(errors.__all__) | {"Event"}, (
                f"zctipc.{module} offers {sorted(offered - names - set(errors.__all__))}, which the package does not"
            )
    assert set(dir(zctipc)) >= set(zctipc.__all__)
