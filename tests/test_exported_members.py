"""The public surface is exactly what __all__ says, and nothing private leaks into it."""

import types

import dispatch_async
import dispatch_async.testing


def isort_order(name: str) -> tuple[int, str]:
    """ruff's order for ``__all__`` (RUF022): CONSTANTS, then Classes, then functions."""
    kind = 0 if name.isupper() else 1 if name[0].isupper() else 2
    return kind, name


def test_all_is_sorted_and_complete() -> None:
    names = dispatch_async.__all__
    assert names == sorted(names, key=isort_order)
    public = {
        name
        for name, value in vars(dispatch_async).items()
        # pytest's assertion rewriting (we ship a plugin) adds non-identifier names.
        if name.isidentifier()
        and not name.startswith("_")
        and not isinstance(value, types.ModuleType)
    } | {"__version__"}
    assert set(names) == public


def test_every_exported_member_is_defined_in_a_private_module() -> None:
    for name in dispatch_async.__all__:
        if name == "__version__":
            continue
        member = getattr(dispatch_async, name)
        if isinstance(member, str | int):  # a constant, such as a reason the SDK records
            continue
        assert member.__module__.startswith("dispatch_async._"), name


def test_testing_package_exports_the_simulator() -> None:
    assert "FakeDispatchServer" in dispatch_async.testing.__all__
    names = dispatch_async.testing.__all__
    assert names == sorted(names, key=isort_order)


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert dispatch_async.__version__ == version("dispatch-async")


def test_instrumentation_package_exports_the_hook_protocol() -> None:
    import dispatch_async.instrumentation as instrumentation

    names = instrumentation.__all__
    assert names == sorted(names)
    assert set(names) == {
        "CallFinished",
        "CallStarted",
        "ChunkAnswered",
        "ChunkSent",
        "ChunkSplit",
        "Event",
        "Hook",
        "LoggingHook",
        "OpenTelemetryHook",
        "Paused",
        "PrometheusHook",
        "RateChanged",
        "RetryScheduled",
        "TokenObtained",
        "get_hooks",
        "set_hooks",
    }
    for name in names:
        if name in ("Event",):  # a type alias
            continue
        module = getattr(instrumentation, name).__module__
        assert module.startswith("dispatch_async.instrumentation._"), name


def test_callbacks_package_exports_its_names_from_private_modules() -> None:
    import dispatch_async.callbacks as callbacks

    names = callbacks.__all__
    assert names == sorted(names, key=isort_order)
    assert {"DeliveryEvent", "DeliveryStatus", "parse_event"} <= set(names)
    for name in names:
        if name.startswith("DEFAULT_"):  # a constant: the defaults the reference shows
            assert isinstance(getattr(callbacks, name), int | float), name
            continue
        module = getattr(callbacks, name).__module__
        assert module.startswith("dispatch_async.callbacks._"), name
