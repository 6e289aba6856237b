"""The built-in processors' stop-string matcher (`kvmesh.stops`, built into the processor host):
text is released as soon as it cannot begin a stop string, and a stop string split over many
chunks is still found."""
import importlib.util
from pathlib import Path

# Loaded from its file under a name of its own: importing the host's `kvmesh` package here would
# shadow the `kvmesh.v1` stubs other tests generate (conftest.proto_stubs).
_STOPS = Path(__file__).resolve().parents[2] / "services" / "processor-host" / "python" / "kvmesh" / "stops.py"
_spec = importlib.util.spec_from_file_location("kvmesh_host_stops", _STOPS)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
StopStrings = _module.StopStrings


def run(stops, chunks, include=False):
    matcher = StopStrings(stops, include)
    out = []
    for chunk in chunks:
        text, matched = matcher.feed(chunk)
        out.append(text)
        if matched:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_no_stop_strings_pass_text_through():
    assert run([], ["ab", "cd"]) == (["ab", "cd", ""], False)


def test_text_that_cannot_start_a_stop_is_released_at_once():
    out, matched = run(["END"], ["hello ", "world"])
    assert out == ["hello ", "world", ""] and not matched


def test_a_stop_split_over_chunks_is_found_and_cut():
    out, matched = run(["END"], ["abc E", "N", "D tail"])
    assert matched
    assert "".join(out) == "abc "
    assert out[0] == "abc "  # "E" was held back: it may begin "END"


def test_a_held_prefix_that_does_not_complete_is_released():
    out, matched = run(["END"], ["x E", "Nx", "y"])
    assert not matched and "".join(out) == "x ENxy"


def test_the_earliest_of_several_stops_wins_and_include_keeps_it():
    out, matched = run(["bb", "a"], ["xxbba"], include=True)
    assert matched and "".join(out) == "xxbb"
