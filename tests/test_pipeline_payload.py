"""The pipeline payload codec (omni_core.pipeline.payload): a pickle-free frame of a JSON header
and raw, 64-byte aligned buffers.

The pure-Python tests run everywhere; the numpy and torch ones skip where those are missing
(tox's ``core`` env has numpy but no torch). Frames for the malformed cases are built by
:func:`_frame`, an independent reading of the layout in the module docstring.
"""

from __future__ import annotations

import array
import ctypes
import enum
import json
import math
import os
import struct
import subprocess
import sys
import warnings
from collections import OrderedDict, namedtuple
from pathlib import Path
from typing import Any

import pytest

from omni_core.errors import PayloadError
from omni_core.pipeline import payload
from omni_core.pipeline.payload import (
    ALIGNMENT,
    MAX_DEPTH,
    PREFIX_SIZE,
    Encoded,
    decode,
    dumps,
    encode,
    frame_size,
    loads,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def np() -> Any:
    return pytest.importorskip("numpy", reason="numpy is not installed in this environment")


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed in this environment (tox's core env)")


# -- helpers -------------------------------------------------------------------------------------


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _frame(
    header: Any,
    buffers: list[bytes] | tuple[bytes, ...] = (),
    *,
    magic: bytes = b"OMNP",
    version: int = 1,
    flags: int = 0,
    total: int | None = None,
) -> bytes:
    """A frame laid out as the module docstring says; ``header`` is JSON data or raw bytes."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = bytearray(head)
    pos = PREFIX_SIZE + len(head)
    for buf in buffers:
        body += bytes(_align(pos) - pos) + buf
        pos = _align(pos) + len(buf)
    if buffers:
        body += bytes(_align(pos) - pos)
        pos = _align(pos)
    size = pos if total is None else total
    return struct.pack("<4sHHIQ", magic, version, flags, len(head), size) + bytes(body)


def _raw_tensor_bytes(t: Any) -> Any:
    return t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(sys.modules["torch"].uint8)


def assert_same(got: Any, want: Any) -> None:
    """``got`` is ``want`` as decoded: same types (bytes-likes become bytes), same dtypes, shapes
    and bits (so NaN payloads and -0.0 count)."""
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if isinstance(want, (bytearray, memoryview)):
        want = bytes(want)
    if np is not None and isinstance(want, np.ndarray):
        assert type(got) is np.ndarray
        assert got.dtype == want.dtype and got.dtype.str == want.dtype.str
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        return
    if torch is not None and isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.device.type == "cpu" and not got.requires_grad
        assert torch.equal(_raw_tensor_bytes(got), _raw_tensor_bytes(want))
        return
    assert type(got) is type(want), (got, want)
    if isinstance(want, float):
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)
        )
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    elif isinstance(want, dict):
        assert [(type(k), k) for k in got] == [(type(k), k) for k in want]
        for key in want:
            assert_same(got[key], want[key])
    elif np is not None and isinstance(want, np.generic):
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    else:
        assert got == want


def round_trips(obj: Any) -> None:
    """``obj`` survives every way through: both copy modes, bytes and bytearray frames, loads."""
    frame = dumps(obj)
    assert frame == encode(obj).to_bytes()
    for decoded in (decode(frame), decode(frame, copy=True), decode(bytearray(frame)), loads(frame)):
        assert_same(decoded, obj)


def _buffer_offsets(frame: bytes) -> list[int]:
    _, _, _, header_len, _ = struct.unpack_from("<4sHHIQ", frame)
    pos = PREFIX_SIZE + header_len
    offsets = []
    for n in json.loads(frame[PREFIX_SIZE : PREFIX_SIZE + header_len])["buffers"]:
        offsets.append(_align(pos))
        pos = _align(pos) + n
    return offsets


def _address(buffer: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


# -- pure Python ---------------------------------------------------------------------------------

SCALARS = [
    None,
    True,
    False,
    0,
    -1,
    2**63 - 1,
    -(2**63) + 1,
    2**63,
    -(2**63),
    2**64 + 5,
    -(10**300),
    10**5000,  # over Python's int-to-decimal limit: must not go through str(int)
    0.0,
    -0.0,
    1.5,
    1e308,
    5e-324,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "h\u00e9llo \u2713 \U0001f600",
    "\ud800 lone surrogate",
    "\x00nul",
    b"",
    b"\x00\xff" * 100,
    bytearray(b"mutable"),
    memoryview(b"a view"),
]


def _scalar_id(value: Any) -> str:
    if type(value) is int and value.bit_length() > 1000:
        return f"int:{value.bit_length()}-bits"
    return f"{type(value).__name__}:{repr(value)[:20]}"


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: _scalar_id(v))
def test_scalars_round_trip(value: Any) -> None:
    round_trips(value)
    round_trips([value])


def test_bytes_likes_decode_to_bytes_in_both_modes() -> None:
    strided = memoryview(b"abcdef")[::2]
    words = memoryview(array.array("I", [1, 2]))
    for value, want in [(bytearray(b"xy"), b"xy"), (strided, b"ace"), (words, words.tobytes())]:
        for copy in (False, True):
            got = decode(dumps({"v": value}), copy=copy)["v"]
            assert type(got) is bytes and got == want


def test_containers_round_trip_with_their_types_and_order() -> None:
    round_trips([])
    round_trips(())
    round_trips({})
    round_trips([[], (), {}, [[[]]]])
    round_trips((1,))
    round_trips({1: "int one", "1": "str one", -5: None, 2**70: "big key", "z": 1, "a": 2})
    round_trips(([1, (2, [3, {"k": (4,)}])], {"t": (None, 1.5, "s", b"b")}))
    shared = [1, 2]
    round_trips([shared, shared, {"again": shared}])


@pytest.mark.parametrize(
    "value",
    [
        {"l": [1], "t": (2,), "d": {}, "I": "ff", "b": 0, "a": 1, "s": 2, "T": 3},
        {"buffers": [1, 2], "root": None},
        ["l", []],
        ["I", "ff"],
        ("b", 0),
        ["T", 0, "float32", [1]],
        ["a", 0, "<f4", []],
        {"__type__": "tensor", "__omni__": ["d", ["x", 1]]},
        [["d", ["a", 1]], {"d": ["d", []]}],
    ],
)
def test_user_data_that_looks_like_tags_round_trips_unchanged(value: Any) -> None:
    round_trips(value)
    frame = dumps(value)
    header = json.loads(frame[PREFIX_SIZE : PREFIX_SIZE + struct.unpack_from("<I", frame, 8)[0]])

    def no_objects(node: Any) -> None:
        assert not isinstance(node, dict)
        if isinstance(node, list):
            for child in node:
                no_objects(child)

    no_objects(header["root"])  # a user's dict never becomes a JSON object


def test_frame_layout_is_the_documented_one() -> None:
    value = {"one": b"x", "sixty-four": bytes(range(64)), "empty": b"", "hundred": b"\x07" * 100, "n": 1}
    encoded = encode(value)
    frame = encoded.to_bytes()
    magic, version, flags, header_len, total = struct.unpack_from("<4sHHIQ", frame)
    assert (magic, version, flags) == (b"OMNP", 1, 0)
    assert total == len(frame) == encoded.nbytes == frame_size(frame)
    assert total % ALIGNMENT == 0
    assert frame[PREFIX_SIZE : PREFIX_SIZE + header_len] == encoded.header
    header = json.loads(encoded.header)
    assert header["buffers"] == [1, 64, 0, 100]
    offsets = _buffer_offsets(frame)
    assert all(offset % ALIGNMENT == 0 for offset in offsets)
    assert offsets[0] == _align(PREFIX_SIZE + header_len)
    for offset, n, want in zip(offsets, header["buffers"], [b"x", bytes(range(64)), b"", b"\x07" * 100], strict=True):
        assert frame[offset : offset + n] == want
    # everything that is not prefix, header or a buffer is zero padding
    padding = bytearray(frame)
    padding[: PREFIX_SIZE + header_len] = bytes(PREFIX_SIZE + header_len)
    for offset, n in zip(offsets, header["buffers"], strict=True):
        padding[offset : offset + n] = bytes(n)
    assert not any(padding)
    assert frame == _frame(encoded.header, [b"x", bytes(range(64)), b"", b"\x07" * 100])


def test_a_frame_without_buffers_has_no_padding() -> None:
    encoded = encode([1, "two", None])
    assert encoded.buffers == []
    assert encoded.nbytes == PREFIX_SIZE + len(encoded.header) == len(encoded.to_bytes())


def test_buffers_are_unsigned_byte_views_and_encode_copies_no_bytes() -> None:
    data = bytearray(b"0123456789")
    encoded = encode({"d": data})
    (buffer,) = encoded.buffers
    assert buffer.format == "B" and buffer.ndim == 1 and buffer.readonly
    data[0] = ord("X")  # the buffer views the bytearray itself
    assert bytes(buffer) == b"X123456789"


def test_write_into_a_larger_region_then_frame_size_and_decode() -> None:
    value = {"a": [b"abc" * 50, (1, 2.5)], "b": b"z"}
    encoded = encode(value)
    region = bytearray(b"\xaa" * (128 + encoded.nbytes + 1000))
    view = memoryview(region)[128:]  # like a segment shared with other frames
    encoded.write_into(view)
    assert bytes(view[: encoded.nbytes]) == encoded.to_bytes()
    assert region[:128] == b"\xaa" * 128 and region[128 + encoded.nbytes :] == b"\xaa" * 1000
    assert frame_size(view) == encoded.nbytes
    assert frame_size(bytes(view[:PREFIX_SIZE])) == encoded.nbytes  # the prefix alone suffices
    assert_same(decode(view), value)  # bytes after the frame are ignored
    assert_same(decode(view, copy=True), value)


def test_write_into_refuses_a_small_or_read_only_target() -> None:
    encoded = encode(b"x" * 100)
    with pytest.raises(PayloadError, match=r"allocate Encoded\.nbytes"):
        encoded.write_into(bytearray(encoded.nbytes - 1))
    with pytest.raises(PayloadError, match="read-only"):
        encoded.write_into(memoryview(bytes(encoded.nbytes)))


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_refused() -> None:
    deep: Any = "leaf"
    for i in range(MAX_DEPTH):
        deep = [deep] if i % 3 else ({"k": deep} if i % 2 else (deep,))
    round_trips(deep)
    with pytest.raises(PayloadError, match=rf"^payload\[0\]\[.* is nested more than {MAX_DEPTH} containers deep"):
        encode([deep])


def test_self_referencing_containers_are_refused() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    with pytest.raises(PayloadError, match=r"payload\[1\] is a container that contains itself"):
        encode(looped)
    owner: dict[str, Any] = {}
    owner["children"] = [{"parent": owner}]
    with pytest.raises(PayloadError, match=r"payload\['children'\]\[0\]\['parent'\] is a container that contains"):
        encode(owner)


class _Color(enum.IntEnum):
    RED = 1


Point = namedtuple("Point", "x y")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"hidden": [1, 2, {3}]},
            "payload['hidden'][2] is a set (convert it to a list or a tuple); a payload carries None, bool, int, "
            "float, str, bytes, lists, tuples, dicts with str or int keys, numpy arrays and torch tensors",
        ),
        (object(), "payload is an object; a payload carries"),
        ([1, 2j], "payload[1] is a complex; a payload carries"),
        ({"f": frozenset()}, "payload['f'] is a frozenset (convert it"),
        ({"o": OrderedDict()}, "payload['o'] is a collections.OrderedDict (a subclass of dict: convert it to a plain"),
        ((Point(1, 2),), "payload[0] is a test_pipeline_payload.Point (a subclass of tuple"),
        ([_Color.RED], "payload[0] is a test_pipeline_payload._Color (a subclass of int"),
        ({"x": {1.5: 1}}, "payload['x'] has the key 1.5 of type float; dict keys in a payload must be str or int"),
        ({True: 1}, "payload has the key True of type bool"),
        ({(1, 2): 1}, "payload has the key (1, 2) of type tuple"),
        ({None: 1}, "payload has the key None of type NoneType"),
        ([{"a": [len]}], "payload[0]['a'][0] is a builtin_function_or_method"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_unsupported_values_are_refused_naming_where(value: Any, message: str) -> None:
    with pytest.raises(PayloadError) as caught:
        encode(value)
    assert message in str(caught.value)


_OK_HEADER = {"buffers": [3], "root": ["b", 0]}
_OK = _frame(_OK_HEADER, [b"abc"])


def _nested_header(depth: int) -> dict[str, Any]:
    node: Any = 1
    for _ in range(depth):
        node = ["l", [node]]
    return {"buffers": [], "root": node}


MALFORMED = {
    "empty": (b"", "shorter than the 20-byte prefix"),
    "short prefix": (_OK[: PREFIX_SIZE - 1], "shorter than the 20-byte prefix"),
    "wrong magic": (_frame(_OK_HEADER, [b"abc"], magic=b"PNMO"), "not a payload frame: it starts with b'PNMO'"),
    "pickle": (b"\x80\x04\x95" + bytes(30), "not a payload frame"),
    "unknown version": (_frame(_OK_HEADER, [b"abc"], version=2), "format version 2"),
    "unknown flags": (_frame(_OK_HEADER, [b"abc"], flags=1), "flags 0x0001"),
    "header past the frame length": (_frame(_OK_HEADER, [b"abc"], total=PREFIX_SIZE + 3), "does not fit"),
    "truncated header": (_OK[: PREFIX_SIZE + 5], "truncated payload frame"),
    "truncated buffers": (_OK[:-1], "truncated payload frame"),
    "length longer than the buffers": (_frame(_OK_HEADER, [b"abc"], total=len(_OK) + 64) + bytes(64), "end at byte"),
    "length shorter than the buffers": (_frame(_OK_HEADER, [b"abc"], total=len(_OK) - 64), "end at byte"),
    "buffer longer than the frame": (_frame({"buffers": [1000], "root": ["b", 0]}, [b"abc"]), "end at byte"),
    "header not UTF-8": (_frame(b"\xff\xfe"), "header is not JSON"),
    "header not JSON": (_frame(b'{"buffers": [], "root": '), "header is not JSON"),
    "header deeper than JSON allows": (_frame(b"[" * 100_000), "header is not JSON"),
    "int over the digit limit": (_frame(b'{"buffers": [], "root": ' + b"1" * 5000 + b"}"), "header is not JSON"),
    "header an array": (_frame([]), 'not an object of "buffers" and "root"'),
    "header without root": (_frame({"buffers": []}), 'not an object of "buffers" and "root"'),
    "header with an extra key": (_frame({"buffers": [], "root": 1, "x": 2}), 'not an object of "buffers"'),
    "buffers not a list": (_frame({"buffers": 3, "root": 1}), "not a list of byte lengths"),
    "negative buffer length": (_frame({"buffers": [-1], "root": 1}), "not a list of byte lengths"),
    "bool buffer length": (_frame({"buffers": [True], "root": 1}), "not a list of byte lengths"),
    "JSON object node": (_frame({"buffers": [], "root": {"a": 1}}), "a node that is a dict"),
    "JSON object in a list": (_frame({"buffers": [], "root": ["l", [1, {"a": 1}]]}), r"at payload[1]"),
    "empty list node": (_frame({"buffers": [], "root": []}), "not a value or a tagged list"),
    "tag not a string": (_frame({"buffers": [], "root": [1, 2]}), "not a value or a tagged list"),
    "unknown tag": (_frame({"buffers": [], "root": ["d", ["k", ["zz", 1]]]}), "unknown node tag 'zz' at payload['k']"),
    "list without items": (_frame({"buffers": [], "root": ["l"]}), "'l' node of 1 items instead of 2"),
    "tuple with extra items": (_frame({"buffers": [], "root": ["t", [], 1]}), "'t' node of 3 items"),
    "list items not a list": (_frame({"buffers": [], "root": ["l", 3]}), "items are not a list"),
    "dict with a dangling key": (_frame({"buffers": [], "root": ["d", ["a"]]}), "a key and no value"),
    "dict with a float key": (_frame({"buffers": [], "root": ["d", [1.5, 1]]}), "dict key 1.5"),
    "dict with a null key": (_frame({"buffers": [], "root": ["d", [None, 1]]}), "dict key None"),
    "dict with a list key": (_frame({"buffers": [], "root": ["d", [["l", []], 1]]}), "dict key ['l', []]"),
    "dict with a key twice": (_frame({"buffers": [], "root": ["d", ["a", 1, "a", 2]]}), "the dict key 'a' twice"),
    "big int with 0x": (_frame({"buffers": [], "root": ["I", "0x1f"]}), "not hexadecimal"),
    "big int with underscores": (_frame({"buffers": [], "root": ["I", "1_0"]}), "not hexadecimal"),
    "big int empty": (_frame({"buffers": [], "root": ["I", ""]}), "not hexadecimal"),
    "big int not a string": (_frame({"buffers": [], "root": ["I", 5]}), "not hexadecimal"),
    "big int dict key": (_frame({"buffers": [], "root": ["d", [["I", "x"], 1]]}), "not hexadecimal"),
    "buffer index out of range": (_frame({"buffers": [3], "root": ["b", 1]}, [b"abc"]), "buffer index 1 out of range"),
    "negative buffer index": (_frame({"buffers": [3], "root": ["b", -1]}, [b"abc"]), "buffer index -1"),
    "bool buffer index": (_frame({"buffers": [3], "root": ["b", True]}, [b"abc"]), "buffer index True"),
    "string buffer index": (_frame({"buffers": [3], "root": ["b", "0"]}, [b"abc"]), "buffer index '0'"),
    "nested too deep": (_frame(_nested_header(MAX_DEPTH + 1)), f"nested more than {MAX_DEPTH} deep"),
}


@pytest.mark.parametrize(("frame", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_raise_payload_error(frame: bytes, message: str) -> None:
    for copy in (False, True):
        with pytest.raises(PayloadError) as caught:
            decode(frame, copy=copy)
        assert message in str(caught.value)


def test_the_deepest_valid_header_decodes() -> None:
    value = decode(_frame(_nested_header(MAX_DEPTH)))
    for _ in range(MAX_DEPTH):
        value = value[0]
    assert value == 1


@pytest.mark.parametrize("frame", ["a str", 12, None, [1, 2], memoryview(_OK)[::2]], ids=repr)
def test_things_that_are_not_byte_buffers_raise_payload_error(frame: Any) -> None:
    with pytest.raises(PayloadError):
        decode(frame)
    with pytest.raises(PayloadError):
        frame_size(frame)


@pytest.mark.parametrize(
    "frame",
    [b"", b"OMNP", b"XXXX" + _OK[4:], _frame(_OK_HEADER, [b"abc"], version=9)],
    ids=["empty", "short", "magic", "version"],
)
def test_frame_size_refuses_what_is_not_a_frame(frame: bytes) -> None:
    with pytest.raises(PayloadError):
        frame_size(frame)


def test_encoded_can_be_built_from_its_parts() -> None:
    original = encode({"x": b"abc", "y": [b"", b"d" * 70]})
    rebuilt = Encoded(original.header, list(original.buffers))
    assert rebuilt.nbytes == original.nbytes and rebuilt.to_bytes() == original.to_bytes()
    assert "buffer" in repr(rebuilt)


def test_importing_and_pure_payloads_need_neither_torch_nor_numpy() -> None:
    code = (
        "import sys\n"
        "import omni_core.pipeline.payload as p\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'import'\n"
        "v = {'a': [1, 2.5, b'x', (None, 'y')], 3: 2**80}\n"
        "assert p.loads(p.dumps(v)) == v and p.decode(p.dumps(v)) == v\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'use'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_a_frame_holding_arrays_names_the_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    tensor_frame = _frame({"buffers": [4], "root": ["d", ["h", ["T", 0, "float32", [1]]]]}, [bytes(4)])
    array_frame = _frame({"buffers": [4], "root": ["l", [["a", 0, "<f4", [1]]]]}, [bytes(4)])
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(PayloadError, match=r"payload\['h'\] is a torch tensor, but torch cannot be imported"):
        decode(tensor_frame)
    with pytest.raises(PayloadError, match=r"payload\[0\] is a numpy array, but numpy cannot be imported"):
        decode(array_frame)


# -- numpy ---------------------------------------------------------------------------------------

NUMPY_DTYPES = ["?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "e", "f", "d", "g", "F", "D", "G"]
NUMPY_DTYPES += [">f4", ">i8", ">c8", "<u2", ">f2"]


def _numpy_values(np: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    rng = np.random.default_rng(0)
    count = math.prod(shape)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return (rng.integers(0, 2, count) == 1).reshape(shape)
    if dt.kind in "iu":
        return (
            rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, count, dtype=dt.newbyteorder("="))
            .astype(dt)
            .reshape(shape)
        )
    values = rng.standard_normal(count) * 1000
    if dt.kind == "c":
        values = values + 1j * rng.standard_normal(count)
    if count > 3:
        values[:3] = [np.nan, np.inf, -0.0]
    return values.astype(dt).reshape(shape)


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (3, 4)], ids=str)
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_arrays_of_every_dtype_and_shape_round_trip(np: Any, dtype: str, shape: tuple[int, ...]) -> None:
    value = _numpy_values(np, dtype, shape)
    assert value.dtype.str == np.dtype(dtype).str and value.shape == shape
    round_trips(value)
    round_trips({"nested": [value, (value,)]})


def test_non_contiguous_numpy_arrays_round_trip(np: Any) -> None:
    base = np.arange(48, dtype=np.float64).reshape(6, 8)
    for value in (base.T, base[::2, 1::3], np.asfortranarray(base), np.broadcast_to(np.arange(3), (4, 3))):
        assert not value.flags.c_contiguous
        round_trips(value)


def test_numpy_array_subclasses_decode_as_ndarray(np: Any, tmp_path: Path) -> None:
    mapped = np.memmap(tmp_path / "a.bin", dtype=np.int32, mode="w+", shape=(5,))
    mapped[:] = [1, 2, 3, 4, 5]
    got = loads(dumps(mapped))
    assert type(got) is np.ndarray and got.dtype == np.int32 and got.tolist() == [1, 2, 3, 4, 5]
    del mapped


@pytest.mark.parametrize(
    "make",
    [
        lambda np: np.float32(1.5),
        lambda np: np.float64("nan"),
        lambda np: np.float16(-0.0),
        lambda np: np.longdouble(1) / 3,
        lambda np: np.int8(-3),
        lambda np: np.uint64(2**64 - 1),
        lambda np: np.longlong(5),
        lambda np: np.int64(5),
        lambda np: np.intc(-7),
        lambda np: np.bool_(True),
        lambda np: np.complex64(1 + 2j),
        lambda np: np.clongdouble(1 - 1j),
    ],
)
def test_numpy_scalars_round_trip_as_the_same_scalar_type(np: Any, make: Any) -> None:
    value = make(np)
    for got in (decode(dumps(value)), loads(dumps(value)), decode(dumps([value]))[0]):
        assert type(got) is type(value)
        if value.dtype in (np.dtype(np.longdouble), np.dtype(np.clongdouble)):
            # 80-bit extended values stored in 16 bytes: the padding bytes are arbitrary
            assert np.array_equal(np.asarray(got), np.asarray(value), equal_nan=True)
        else:
            assert np.asarray(got).tobytes() == np.asarray(value).tobytes()


def test_numpy_encode_views_the_array_and_decode_views_the_frame(np: Any) -> None:
    value = np.arange(1 << 18, dtype=np.float32)
    encoded = encode({"x": value})
    assert np.shares_memory(np.frombuffer(encoded.buffers[0], dtype=np.uint8), value)
    frame = bytearray(encoded.nbytes)
    encoded.write_into(frame)
    whole = np.frombuffer(frame, dtype=np.uint8)
    shared = decode(frame)["x"]
    assert np.shares_memory(shared, whole) and shared.flags.writeable
    assert shared.ctypes.data % ALIGNMENT == (_address(frame) + _buffer_offsets(bytes(frame))[0]) % ALIGNMENT
    owned = decode(frame, copy=True)["x"]
    assert not np.shares_memory(owned, whole) and owned.flags.writeable and owned.flags.owndata
    read_only = decode(bytes(frame))["x"]
    assert not read_only.flags.writeable  # a view of immutable bytes
    assert np.array_equal(shared, value) and np.array_equal(owned, value) and np.array_equal(read_only, value)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda np: {"ids": np.array(["a", "b"])}, "payload['ids'] is a numpy array of dtype <U1"),
        (lambda np: [np.array([object()])], "payload[0] is a numpy array of dtype object"),
        (lambda np: np.zeros(2, dtype="i4,f4"), "payload is a numpy array of dtype"),
        (lambda np: np.array(["2020-01-01"], dtype="datetime64[D]"), "dtype datetime64[D]"),
        (lambda np: {"s": np.str_("x")}, "payload['s'] is a numpy scalar of dtype <U1"),
        (lambda np: np.void(b"ab"), "payload is a numpy scalar of dtype |V2"),
        (lambda np: {"m": np.ma.masked_array([1, 2], mask=[0, 1])}, "payload['m'] is a numpy masked array"),
    ],
)
def test_numpy_values_without_a_numeric_dtype_are_refused(np: Any, make: Any, message: str) -> None:
    with pytest.raises(PayloadError) as caught:
        encode(make(np))
    assert message in str(caught.value)


NUMPY_MALFORMED = {
    "unknown dtype": (["a", 0, "<x9", [1]], "unknown numpy dtype '<x9'"),
    "dtype not a string": (["a", 0, 4, [1]], "unknown numpy dtype 4"),
    "object dtype": (["a", 0, "|O", [1]], "dtype '|O', which a payload does not carry"),
    "str dtype": (["a", 0, "<U1", [1]], "which a payload does not carry"),
    "structured dtype": (["a", 0, "[('a', '<i4')]", [1]], "numpy dtype"),
    "not canonical dtype": (["a", 0, "=f4", [2]], "which a payload does not carry"),
    "shape against bytes": (["a", 0, "<f4", [3]], "shape [3] and dtype <f4 (12 bytes) in a buffer of 8 bytes"),
    "negative dimension": (["a", 0, "<f4", [-2]], "not a list of at most 64 sizes"),
    "shape not a list": (["a", 0, "<f4", 2], "not a list of at most 64 sizes"),
    "too many dimensions": (["a", 0, "<f4", [1] * 65], "not a list of at most 64 sizes"),
    "array arity": (["a", 0, "<f4"], "'a' node of 3 items instead of 4"),
    "bad bool bytes": (["a", 0, "|b1", [8]], "bool array holding bytes other than 0 and 1"),
    "scalar type against dtype": (["s", 0, "<f4", "d"], "which a payload does not carry"),
    "scalar type not a string": (["s", 0, "<f8", 5], "unknown numpy dtype"),
    "scalar size": (["s", 0, "<f4", "f"], "(4 bytes) in a buffer of 8 bytes"),
}


@pytest.mark.parametrize(("node", "message"), NUMPY_MALFORMED.values(), ids=NUMPY_MALFORMED.keys())
def test_malformed_numpy_leaves_raise_payload_error(np: Any, node: list[Any], message: str) -> None:
    frame = _frame({"buffers": [8], "root": node}, [bytes(range(8))])
    with pytest.raises(PayloadError) as caught:
        decode(frame)
    assert message in str(caught.value)


# -- torch ---------------------------------------------------------------------------------------

TORCH_DTYPES = sorted(payload._TORCH_DTYPES)


def _torch_values(torch: Any, name: str, shape: tuple[int, ...]) -> Any:
    """Random bits of every dtype (NaN patterns included), bools as 0/1."""
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"torch {torch.__version__} has no {name}")
    generator = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator) == 1
    raw = torch.randint(
        0,
        256,
        (*shape[:-1], shape[-1] * dtype.itemsize) if shape else (dtype.itemsize,),
        generator=generator,
        dtype=torch.uint8,
    )
    return raw.view(dtype).reshape(shape)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")  # torch's, for complex32
@pytest.mark.parametrize("shape", [(), (0, 4), (3, 5)], ids=str)
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_tensors_of_every_dtype_and_shape_round_trip(torch: Any, name: str, shape: tuple[int, ...]) -> None:
    value = _torch_values(torch, name, shape)
    assert value.dtype == getattr(torch, name) and tuple(value.shape) == shape
    round_trips(value)
    if value.dim() == 2 and value.numel():
        transposed = value.T
        assert not transposed.is_contiguous()
        round_trips(transposed)


def test_torch_values_survive_exactly(torch: Any) -> None:
    floats = torch.tensor([1.5, -2.0, float("nan"), float("inf"), -0.0, 3.1e-5])
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        value = floats.to(dtype)
        for got in (decode(dumps(value)), loads(dumps(value))):
            assert got.dtype == dtype
            assert torch.equal(got.isnan(), value.isnan())
            assert torch.equal(got.nan_to_num(0.0), value.nan_to_num(0.0))
            assert torch.equal(got.signbit(), value.signbit())  # -0.0 stays -0.0
    ints = torch.tensor([-(2**63), -1, 0, 2**63 - 1], dtype=torch.int64)
    assert torch.equal(loads(dumps(ints)), ints)
    assert torch.equal(loads(dumps(torch.tensor(True))), torch.tensor(True))
    assert loads(dumps(torch.tensor(7, dtype=torch.int16))).shape == ()


def test_non_contiguous_tensors_are_made_contiguous(torch: Any) -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    for value in (base.T, base[::2, 1::3], torch.arange(3).expand(4, 3), base.T.to(torch.bfloat16)):
        assert not value.is_contiguous()
        for got in (decode(dumps(value)), loads(dumps(value))):
            assert got.is_contiguous() and torch.equal(got, value)


def test_tensors_are_detached_resolved_and_decoded_as_plain_tensors(torch: Any) -> None:
    leaf = torch.randn(4, requires_grad=True)
    computed = leaf * 2
    parameter = torch.nn.Parameter(torch.randn(2, 3))
    complex_ = torch.randn(3, dtype=torch.complex64)
    conjugated = complex_.conj()
    negated = conjugated.imag
    assert conjugated.is_conj() and negated.is_neg()
    got = loads(dumps({"leaf": leaf, "computed": computed, "param": parameter, "conj": conjugated, "neg": negated}))
    for key, want in [("leaf", leaf), ("computed", computed), ("param", parameter)]:
        assert type(got[key]) is torch.Tensor and not got[key].requires_grad
        assert torch.equal(got[key], want.detach())
    assert not got["conj"].is_conj() and torch.equal(got["conj"], complex_.conj().resolve_conj())
    assert not got["neg"].is_neg() and torch.equal(got["neg"], -complex_.imag)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda torch: {"s": torch.eye(3).to_sparse()}, "payload['s'] is a torch tensor with layout torch.sparse_coo"),
        (lambda torch: [torch.empty(3, device="meta")], "payload[0] is a torch tensor on the meta device"),
        (lambda torch: torch.zeros(2, dtype=getattr(torch, "bits8", torch.uint8)), "dtype torch.bits8"),
        (lambda torch: torch.zeros(2, dtype=getattr(torch, "uint4", torch.uint8)), "dtype torch.uint4"),
    ],
    ids=["sparse", "meta", "bits8", "uint4"],
)
def test_tensors_that_cannot_be_carried_are_refused(torch: Any, make: Any, message: str) -> None:
    value = make(torch)
    if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
        pytest.skip(f"torch {torch.__version__} lacks the dtype")
    with pytest.raises(PayloadError) as caught:
        encode(value)
    assert message in str(caught.value)


def test_a_256_mb_tensor_is_encoded_and_decoded_without_copies(torch: Any) -> None:
    value = torch.empty(64 * 1024 * 1024, dtype=torch.float32)  # 256 MB
    value[::4096] = torch.arange(16384, dtype=torch.float32)
    encoded = encode({"hidden": value})
    (buffer,) = encoded.buffers
    assert buffer.nbytes == value.numel() * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # frombuffer of a read-only view warns
        assert torch.frombuffer(buffer, dtype=torch.uint8).data_ptr() == value.data_ptr()  # no copy in encode
    frame = bytearray(encoded.nbytes)
    encoded.write_into(frame)
    decoded = decode(frame)["hidden"]
    start = _address(frame)
    assert start <= decoded.data_ptr() and decoded.data_ptr() + value.numel() * 4 <= start + len(frame)
    assert (decoded.data_ptr() - start) % ALIGNMENT == 0
    assert decoded.dtype == torch.float32 and decoded.shape == value.shape
    assert torch.equal(decoded[::4096], value[::4096])
    assert decoded.data_ptr() - start == _buffer_offsets(bytes(frame[: PREFIX_SIZE + len(encoded.header)]))[0]
    frame[decoded.data_ptr() - start + 3] ^= 0x80  # flip the sign of element 0 in the frame
    assert decoded[0].item() == -value[0].item()  # the decoded tensor is the frame's memory


def test_copy_true_tensors_own_their_memory(torch: Any) -> None:
    value = torch.arange(1000, dtype=torch.int64)
    frame = bytearray(dumps(value))
    start, end = _address(frame), _address(frame) + len(frame)
    owned = decode(frame, copy=True)
    assert not start <= owned.data_ptr() < end
    frame[:] = bytes(len(frame))
    assert torch.equal(owned, value)


def test_a_read_only_frame_decodes_without_torchs_warning(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch warns about a read-only buffer once per process, so the warning is raised here on
    # every call (by a wrapper) to see that decode silences it, and only for read-only frames
    frombuffer = torch.frombuffer
    calls = []

    def warning_frombuffer(buffer: Any, **kwargs: Any) -> Any:
        calls.append(memoryview(buffer).readonly)
        warnings.warn("The given buffer is not writable, and PyTorch does not support it", UserWarning, stacklevel=2)
        return frombuffer(buffer, **kwargs)

    monkeypatch.setattr(torch, "frombuffer", warning_frombuffer)
    value = torch.arange(6.0).reshape(2, 3)
    frame = dumps(value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(decode(frame), value) and torch.equal(decode(frame, copy=True), value)
    assert calls == [True, True]
    with pytest.warns(UserWarning, match="not writable"):  # a writable frame: frombuffer is left alone
        decode(bytearray(frame))


def test_nested_structures_of_tensors_and_arrays_round_trip(torch: Any, np: Any) -> None:
    value = {
        "thinker": [
            (torch.randn(2, 3), np.arange(4, dtype=np.int16)),
            (torch.zeros(0, dtype=torch.bfloat16), np.float32(2.5), b"codec"),
        ],
        7: {"ids": torch.tensor([1, 2, 3]), "mask": np.array([True, False]), "meta": {"sr": 24000, "t": (1.5, None)}},
        "audio": [torch.randn(16000).to(torch.float16), np.zeros((2, 0), dtype=np.complex64)],
    }
    round_trips(value)
    assert all(offset % ALIGNMENT == 0 for offset in _buffer_offsets(dumps(value)))


def test_a_tensor_on_an_accelerator_is_moved_to_the_cpu(torch: Any) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    value = torch.randn(3, 4, device="cuda").to(torch.bfloat16)
    got = loads(dumps({"x": value}))["x"]
    assert got.device.type == "cpu" and torch.equal(got, value.cpu())


TORCH_MALFORMED = {
    "unknown dtype": (["T", 0, "float99", [2]], "torch dtype 'float99', which a payload does not carry"),
    "quantized dtype": (["T", 0, "qint8", [8]], "torch dtype 'qint8'"),
    "dtype not a string": (["T", 0, 7, [2]], "torch dtype 7"),
    "shape against bytes": (["T", 0, "float32", [3]], "(12 bytes) in a buffer of 8 bytes"),
    "shape not a list": (["T", 0, "float32", None], "not a list of at most 64 sizes"),
    "bool dimension": (["T", 0, "float32", [True, 2]], "not a list of at most 64 sizes"),
    "bad bool bytes": (["T", 0, "bool", [8]], "bool tensor holding bytes other than 0 and 1"),
    "arity": (["T", 0, "float32", [2], 1], "'T' node of 5 items instead of 4"),
}


@pytest.mark.parametrize(("node", "message"), TORCH_MALFORMED.values(), ids=TORCH_MALFORMED.keys())
def test_malformed_torch_leaves_raise_payload_error(torch: Any, node: list[Any], message: str) -> None:
    frame = _frame({"buffers": [8], "root": node}, [bytes(range(8))])
    with pytest.raises(PayloadError) as caught:
        decode(frame)
    assert message in str(caught.value)


def test_buffers_and_views_keep_their_memory_alive(torch: Any, np: Any) -> None:
    import gc

    encoded = encode({"t": torch.arange(1000, dtype=torch.int64) * 3, "a": np.arange(1000) * 5})  # temporaries
    decoded = decode(bytearray(encoded.to_bytes()))  # the frame is referenced by the views alone
    gc.collect()
    clobber = [torch.full((1000,), -1, dtype=torch.int64) for _ in range(50)], [np.full(1000, -1) for _ in range(50)]
    assert torch.equal(loads(encoded.to_bytes())["t"], torch.arange(1000) * 3)
    assert torch.equal(decoded["t"], torch.arange(1000) * 3)
    assert np.array_equal(decoded["a"], np.arange(1000) * 5)
    del clobber


def _fuzz(frame: bytes, rounds: int, seed: int) -> int:
    """Decode ``rounds`` corruptions of ``frame`` (bytes overwritten, mostly in the prefix and
    header, sometimes cut short): each decodes or raises PayloadError, never anything else."""
    import random

    rng = random.Random(seed)
    decoded = 0
    for _ in range(rounds):
        corrupt = bytearray(frame)
        for _ in range(rng.randint(1, 4)):
            spot = rng.randrange(len(corrupt)) if rng.random() < 0.3 else rng.randrange(min(len(corrupt), 400))
            corrupt[spot] = rng.randrange(256)
        if rng.random() < 0.1:
            corrupt = corrupt[: rng.randrange(len(corrupt))]
        try:
            decode(bytes(corrupt), copy=rng.random() < 0.5)
            decoded += 1
        except PayloadError:
            pass
    return decoded


def test_corrupted_frames_raise_only_payload_error() -> None:
    frame = dumps({"a": [1, 2.5, b"xy", (None, 2**70, "s")], 3: {"k": [True, -0.0]}, "b": b"z" * 70})
    assert 0 < _fuzz(frame, 3000, seed=1) < 3000  # some corruptions are still frames (a changed digit)


def test_corrupted_frames_with_arrays_raise_only_payload_error(torch: Any, np: Any) -> None:
    value = {
        "t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "mask": torch.tensor([True, False]),
        "n": np.arange(4, dtype="<i2"),
        "s": np.float32(2),
        "m": np.array([True]),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own warnings for odd dtypes
        _fuzz(dumps(value), 2000, seed=2)
