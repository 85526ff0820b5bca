import traceback

from chasqui_core.engine.jobs.tracebacks import format_exception


def _inner(x):
    return {}[x]


def _outer():
    try:
        _inner("missing")
    except KeyError as exc:
        raise RuntimeError("lookup failed") from exc


def test_format_matches_the_standard_shape_with_causes():
    try:
        _outer()
    except RuntimeError as exc:
        ours = format_exception(exc)
        standard = "".join(traceback.format_exception(exc))
    assert ours.count("Traceback (most recent call last):") == 2
    assert "The above exception was the direct cause" in ours
    assert "KeyError: 'missing'" in ours and ours.rstrip().endswith("RuntimeError: lookup failed")
    assert 'in _inner\n    return {}[x]\n' in ours
    # the same frames, in the same order, as the standard library prints
    frames = [line for line in standard.splitlines() if line.startswith("  File ")]
    assert frames == [line for line in ours.splitlines() if line.startswith("  File ")]


def test_context_chain_and_exceptions_without_traceback():
    try:
        try:
            raise ValueError("first")
        except ValueError:
            raise TypeError("second")  # noqa: B904 - the implicit context is what this test formats
    except TypeError as exc:
        text = format_exception(exc)
    assert "During handling of the above exception" in text
    assert text.index("ValueError: first") < text.index("TypeError: second")
    assert format_exception(OSError("bare")) == "OSError: bare\n"


def test_remembered_paths_tell_code_objects_and_lines_apart():
    def made(name):
        namespace = {}
        exec(f"def {name}(x):\n    if x:\n        raise ValueError(x)\n    raise KeyError(x)\n", namespace)
        return namespace[name]

    texts = []
    for fn, arg in ((made("first"), 1), (made("second"), 1), (made("second"), 0), (made("first"), 1)):
        try:
            fn(arg)
        except (ValueError, KeyError) as exc:
            texts.append(format_exception(exc))
    assert "in first\n" in texts[0] and "in second\n" in texts[1]
    assert "line 3," in texts[1] and "line 4," in texts[2]
    assert texts[3] == texts[0]  # the same path again: the same text, from the cache


def test_describe_gives_what_the_long_way_gives_for_every_kind_of_failure():
    from chasqui_core.engine.jobs.tracebacks import class_path, describe, message, printable

    def fail(text, note=None):
        err = ValueError(text)
        if note:
            err.add_note(note)
        raise err

    made = []
    for text, note in (("a", None), ("a", None), ("b", None), ("a", "first note"), ("a", "second note"),
                       ("bad \udcff byte", None)):
        try:
            fail(text, note)
        except ValueError as exc:
            made.append(exc)
    try:
        _outer()
    except RuntimeError as exc:
        made.append(exc)
    for exc in made:
        assert describe(exc) == (class_path(exc), message(exc), printable(format_exception(exc)))
    assert describe(made[0]) == describe(made[1]) and describe(made[0]) != describe(made[2])
    assert "second note" in describe(made[4]).traceback and "first note" not in describe(made[4]).traceback


def test_a_repeated_failure_is_described_as_its_own_class_and_message():
    """Failures are remembered by path, class and message: same-named classes and new messages stay apart."""
    from chasqui_core.engine.jobs import tracebacks
    from chasqui_core.engine.jobs.tracebacks import describe

    def raiser(cls, text):
        raise cls(text)

    first = type("Refused", (Exception,), {"__module__": "app.one"})
    second = type("Refused", (Exception,), {"__module__": "app.two"})
    described = []
    for cls, text in ((first, "no"), (second, "no"), (first, "no"), (first, "other")):
        try:
            raiser(cls, text)
        except Exception as exc:
            described.append(describe(exc))
    assert [d.error_class for d in described] == ["app.one.Refused", "app.two.Refused", "app.one.Refused",
                                                  "app.one.Refused"]
    assert described[0] == described[2] and described[3].message == "other"
    assert described[1].traceback.endswith("app.two.Refused: no\n")
    assert described[3].traceback.endswith("app.one.Refused: other\n")
    # remembered descriptions hold code ids that only the frames cache keeps alive: they go together
    for n in range(tracebacks._FRAMES_CACHE_SIZE + 1):  # new paths, until the frames cache is full and cleared
        namespace: dict = {}
        exec(f"def f{n}():\n    raise ValueError('x')\n", namespace)
        try:
            namespace[f"f{n}"]()
        except ValueError as exc:
            describe(exc)
    assert len(tracebacks._DESCRIBED) <= len(tracebacks._FRAMES_CACHE)
    assert all(key[0] in tracebacks._FRAMES_CACHE for key in tracebacks._DESCRIBED if key[0])
