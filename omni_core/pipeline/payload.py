"""The payload codec: how a payload crosses a process boundary between pipeline stages, without pickle.

A payload is a tree of ``None``, ``bool``, ``int`` (any size), ``float`` (NaN and infinities
too), ``str``, ``bytes`` (``bytearray`` and ``memoryview`` are taken too), ``list``, ``tuple``,
``dict`` (``str`` or ``int`` keys, order kept), numpy arrays and scalars (bool and numeric
dtypes) and torch tensors (bool, integer, floating, complex and float8 dtypes). Each decodes
to its own type, except that every bytes-like value decodes to ``bytes``, an ndarray subclass
(``np.memmap``) to ``np.ndarray`` and a tensor subclass (``nn.Parameter``) to ``torch.Tensor``.
Refused: subclasses of the builtin types (``OrderedDict``, named tuples, ``IntEnum``), sets,
object, string, record and datetime arrays, masked arrays, sparse, quantized, sub-byte and
meta tensors.

* :func:`encode` gives an :class:`Encoded`: the JSON header and one view per buffer of the
  arrays' own memory (no copy, except to make a non-contiguous array contiguous or to move a
  tensor to the CPU). Tensors are detached; conjugate and negative views are resolved. The
  views are live: changing an array before :meth:`Encoded.write_into` changes what is written.
* :meth:`Encoded.write_into` writes the frame into any writable buffer (a shared-memory
  segment's ``buf``) with one copy per buffer; :meth:`Encoded.to_bytes` / :func:`dumps` build
  ``bytes``.
* :func:`decode` with ``copy=False`` returns arrays and tensors that view the frame (they keep
  it alive; a ``bytearray`` cannot be resized while they exist). Views of an immutable frame
  (``bytes``) are read-only numpy arrays, but torch has no read-only tensors: never write to
  such a tensor (the warning torch gives for one is silenced, with ``warnings.catch_warnings``,
  which is process-wide while it lasts). ``copy=True`` (and :func:`loads`) gives arrays and
  tensors that own their memory. ``bytes`` leaves are copied in both modes, so no type
  depends on ``copy``.
* Decoding imports numpy or torch only if the frame holds their arrays; importing this module
  and encoding import neither.

Frame layout (integers little-endian)::

    offset  size  field
    0       4     magic b"OMNP"
    4       2     u16 format version: 1
    6       2     u16 flags: 0 (a frame with other flags is refused)
    8       4     u32 H, the header's length
    12      8     u64 N, the frame's total length
    20      H     the header: JSON, UTF-8 (written as ASCII, escaping every other character)
                  zero padding to the next multiple of 64
                  buffer 0, zero padding to the next multiple of 64, buffer 1, ...

Every buffer starts at a multiple of 64 from the frame's start; offsets are not stored, each
follows from the lengths before it. N is ``20 + H`` without buffers, else the end of the last
buffer's padding. Bytes after N are ignored: :func:`frame_size` reads N from the first 20
bytes, for a reader of a larger region (or a stream).

The header is ``{"buffers": [length, ...], "root": node}``, where a node is one of::

    null, true, false, a string, a number   itself: an integer is an int (written so when
                                            |n| < 2**63), a number with "." or "e" a float,
                                            NaN / Infinity / -Infinity a float
    ["I", "-1f..."]                         an int beyond 64 bits, in hexadecimal
    ["l", [node, ...]]                      a list
    ["t", [node, ...]]                      a tuple
    ["d", [key, node, key, node, ...]]      a dict in order; a key is a string, an integer or
                                            an ["I", ...] node
    ["b", i]                                bytes: buffer i
    ["a", i, dtype, [dim, ...]]             a numpy array, C order; dtype is numpy's
                                            ``dtype.str`` ("<f4", "|b1", ">i8")
    ["s", i, dtype, char]                   a numpy scalar: ``dtype.str`` and ``dtype.char``
                                            (which tells np.longlong from np.int64)
    ["T", i, dtype, [dim, ...]]             a torch tensor, C order, in the host's byte order;
                                            dtype is torch's name ("bfloat16")

A user's dict never becomes a JSON object, so none of its keys can pass for a tag. Containers
nest at most :data:`MAX_DEPTH` deep and may not contain themselves. Every failure, encoding or
decoding, raises :class:`~omni_core.errors.PayloadError` naming the place in the payload
(``payload['hidden'][2]``) and the fix.
"""

from __future__ import annotations

import ctypes
import json
import re
import struct
import sys
import warnings
from typing import Any

from omni_core.errors import PayloadError

__all__ = [
    "ALIGNMENT",
    "MAGIC",
    "MAX_DEPTH",
    "PREFIX_SIZE",
    "VERSION",
    "Encoded",
    "decode",
    "dumps",
    "encode",
    "frame_size",
    "loads",
]

MAGIC = b"OMNP"
#: the format version this module writes and reads
VERSION = 1
_PREFIX = struct.Struct("<4sHHIQ")
#: the fixed prefix: magic, version, flags, header length, frame length
PREFIX_SIZE = _PREFIX.size
#: every buffer starts at a multiple of this many bytes from the frame's start
ALIGNMENT = 64
#: containers (lists, tuples, dicts) nest at most this deep
MAX_DEPTH = 100
#: ints inside (-_BIG, _BIG) are JSON integers; the rest are ["I", hex] nodes
_BIG = 2**63
_MAX_DIMS = 64
#: the types that are their own node
_SELF_TYPES = frozenset({type(None), bool, str, float})
_HEX = re.compile(r"-?[0-9a-f]+")

#: the torch dtypes carried (those this torch has): plain numbers, stored as raw bytes
_TORCH_DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex32",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
    }
)

_CARRIES = (
    "a payload carries None, bool, int, float, str, bytes, lists, tuples, dicts with str or int keys, "
    "numpy arrays and torch tensors"
)
_NOT_A_FRAME = "the bytes are not a frame omni_core.pipeline.payload wrote (or were cut short or corrupted in transit)"


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _layout(header_len: int, lengths: list[int]) -> tuple[list[int], int]:
    """Each buffer's offset, and the frame's total length."""
    pos = PREFIX_SIZE + header_len
    if not lengths:
        return [], pos
    offsets = []
    for n in lengths:
        pos = _align(pos)
        offsets.append(pos)
        pos += n
    return offsets, _align(pos)


def _where(path: list[Any]) -> str:
    return "payload" + "".join(f"[{key!r}]" for key in path)


def _byte_view(obj: Any, what: str) -> memoryview:
    """A 1-D unsigned-byte view of a buffer (no copy)."""
    try:
        view = memoryview(obj)
    except TypeError:
        raise PayloadError(f"{what} must be bytes, bytearray or a memoryview, not {type(obj).__name__}") from None
    if not view.c_contiguous:
        raise PayloadError(f"{what} must be one contiguous buffer; copy it first (bytes(view))")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class Encoded:
    """An encoded payload: the header and views of its buffers, not yet laid out in one frame.

    ``buffers`` are 1-D unsigned-byte views, read-only, of the arrays' own memory where the
    payload allowed it. Treat both fields as read-only.
    """

    __slots__ = ("buffers", "header")

    def __init__(self, header: bytes, buffers: list[memoryview]) -> None:
        if len(header) > 0xFFFFFFFF:
            raise PayloadError(
                f"the payload's header is {len(header):,} bytes, over the format's 4 GiB; send large "
                "sequences as arrays or tensors, not as lists"
            )
        self.header = header
        self.buffers = [_byte_view(b, "a buffer") for b in buffers]

    def _lengths(self) -> list[int]:
        return [b.nbytes for b in self.buffers]

    @property
    def nbytes(self) -> int:
        """The size of the frame :meth:`write_into` and :meth:`to_bytes` produce."""
        return _layout(len(self.header), self._lengths())[1]

    def _prefix(self, total: int) -> bytes:
        return _PREFIX.pack(MAGIC, VERSION, 0, len(self.header), total)

    def write_into(self, target: memoryview | bytearray) -> None:
        """Write the frame into ``target[:nbytes]``: one copy per buffer, padding zeroed.
        ``target`` may be larger (a shared-memory segment); what lies after the frame is left."""
        offsets, total = _layout(len(self.header), self._lengths())
        out = _byte_view(target, "the target")
        if out.readonly:
            raise PayloadError("the target of write_into is read-only; pass a writable buffer (a bytearray, shm.buf)")
        if out.nbytes < total:
            raise PayloadError(
                f"the target of write_into holds {out.nbytes:,} bytes but the frame needs {total:,}; "
                "allocate Encoded.nbytes bytes"
            )
        head = PREFIX_SIZE + len(self.header)
        out[:PREFIX_SIZE] = self._prefix(total)
        out[PREFIX_SIZE:head] = self.header
        pos = head
        for offset, buffer in zip(offsets, self.buffers, strict=True):
            out[pos:offset] = bytes(offset - pos)
            end = offset + buffer.nbytes
            out[offset:end] = buffer
            pos = end
        out[pos:total] = bytes(total - pos)

    def to_bytes(self) -> bytes:
        """The frame as ``bytes`` (one copy of each buffer)."""
        offsets, total = _layout(len(self.header), self._lengths())
        parts: list[bytes | memoryview] = [self._prefix(total), self.header]
        pos = PREFIX_SIZE + len(self.header)
        for offset, buffer in zip(offsets, self.buffers, strict=True):
            parts += [bytes(offset - pos), buffer]
            pos = offset + buffer.nbytes
        parts.append(bytes(total - pos))
        return b"".join(parts)

    def __repr__(self) -> str:
        return f"<Encoded {self.nbytes:,} bytes: header {len(self.header):,}, {len(self.buffers)} buffer(s)>"


# -- encoding ------------------------------------------------------------------------------------


def encode(obj: Any) -> Encoded:
    """Encode a payload (see the module docstring for what it may hold); raises
    :class:`PayloadError` naming the first value it cannot carry."""
    encoder = _Encoder()
    root = encoder.node(obj, 0)
    header = {"buffers": [b.nbytes for b in encoder.buffers], "root": root}
    text = json.dumps(header, ensure_ascii=True, allow_nan=True, separators=(",", ":"))
    return Encoded(text.encode("ascii"), encoder.buffers)


def dumps(obj: Any) -> bytes:
    """The payload as one frame: ``encode(obj).to_bytes()``."""
    return encode(obj).to_bytes()


def _describe(obj: Any) -> str:
    cls = type(obj)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _numpy_dtype_ok(dtype: Any) -> bool:
    return dtype.kind in "biufc" and dtype.fields is None and dtype.subdtype is None and not dtype.hasobject


class _Encoder:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.path: list[Any] = []
        self.active: set[int] = set()  # ids of the containers being encoded (to find cycles)

    def where(self) -> str:
        return _where(self.path)

    def add(self, view: memoryview) -> int:
        self.buffers.append(view.toreadonly())
        return len(self.buffers) - 1

    def node(self, obj: Any, depth: int) -> Any:
        cls = type(obj)
        if obj is None or cls is bool or cls is str or cls is float:
            return obj
        if cls is int:
            return obj if -_BIG < obj < _BIG else ["I", format(obj, "x")]
        if cls is list or cls is tuple or cls is dict:
            return self.container(obj, depth)
        if cls is bytes or cls is bytearray or cls is memoryview:
            return ["b", self.add(self.bytes_view(obj))]
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, (np.ndarray, np.generic)):
            return self.numpy(obj, np)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self.tensor(obj, torch)
        raise self.unsupported(obj)

    def unsupported(self, obj: Any) -> PayloadError:
        hint = ""
        if isinstance(obj, (set, frozenset)):
            hint = " (convert it to a list or a tuple)"
        else:
            for base in (bool, int, float, str, bytes, list, tuple, dict):
                if isinstance(obj, base):
                    hint = f" (a subclass of {base.__name__}: convert it to a plain {base.__name__} first)"
                    break
        return PayloadError(f"{self.where()} is {_describe(obj)}{hint}; {_CARRIES}")

    def container(self, obj: list[Any] | tuple[Any, ...] | dict[Any, Any], depth: int) -> list[Any]:
        if depth >= MAX_DEPTH:
            raise PayloadError(
                f"{self.where()} is nested more than {MAX_DEPTH} containers deep; a payload nests at most "
                f"{MAX_DEPTH} lists, tuples or dicts: flatten it"
            )
        key = id(obj)
        if key in self.active:
            raise PayloadError(
                f"{self.where()} is a container that contains itself; a payload must be a tree: break the cycle"
            )
        self.active.add(key)
        path = self.path
        out: list[Any] = []
        if type(obj) is dict:
            for k, value in obj.items():
                kind = type(k)
                if kind is str:
                    out.append(k)
                elif kind is int:
                    out.append(k if -_BIG < k < _BIG else ["I", format(k, "x")])
                else:
                    raise PayloadError(
                        f"{self.where()} has the key {k!r:.80} of type {kind.__name__}; dict keys in a payload "
                        "must be str or int: convert it (e.g. str(key))"
                    )
                path.append(k)
                out.append(self.node(value, depth + 1))
                path.pop()
            tag = "d"
        else:
            path.append(0)
            for i, item in enumerate(obj):
                kind = type(item)
                if kind in _SELF_TYPES or (kind is int and -_BIG < item < _BIG):
                    out.append(item)
                else:
                    path[-1] = i
                    out.append(self.node(item, depth + 1))
            path.pop()
            tag = "l" if type(obj) is list else "t"
        self.active.discard(key)
        return [tag, out]

    def bytes_view(self, obj: bytes | bytearray | memoryview) -> memoryview:
        try:
            view = memoryview(obj)
            if not view.c_contiguous:
                return memoryview(view.tobytes())
            return view if view.format == "B" and view.ndim == 1 else view.cast("B")
        except ValueError as exc:  # a released memoryview
            raise PayloadError(f"{self.where()} is a memoryview that cannot be read ({exc}); pass bytes") from None

    def numpy(self, obj: Any, np: Any) -> list[Any]:
        dtype = obj.dtype
        scalar = isinstance(obj, np.generic)
        if not _numpy_dtype_ok(dtype):
            what = "scalar" if scalar else "array"
            raise PayloadError(
                f"{self.where()} is a numpy {what} of dtype {dtype}; a payload carries numpy {what}s of bool and "
                "numeric dtypes only: convert it (strings to a list of str, records to a dict of arrays)"
            )
        if scalar:
            array = np.asarray(obj)
            return ["s", self.add(memoryview(array.reshape(-1).view(np.uint8))), dtype.str, dtype.char]
        masked = sys.modules.get("numpy.ma")
        if masked is not None and isinstance(obj, masked.MaskedArray):
            raise PayloadError(
                f"{self.where()} is a numpy masked array; a payload carries plain arrays: send its data and its "
                "mask as two arrays (a.data, a.mask)"
            )
        array = obj if type(obj) is np.ndarray else obj.view(np.ndarray)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        raw = array.reshape(-1).view(np.uint8)
        return ["a", self.add(memoryview(raw)), dtype.str, list(array.shape)]

    def tensor(self, obj: Any, torch: Any) -> list[Any]:
        name = str(obj.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise PayloadError(
                f"{self.where()} is a torch tensor of dtype {obj.dtype}; a payload carries tensors of bool, "
                "integer, floating, complex and float8 dtypes: convert it (t.dequantize(), t.to(torch.uint8))"
            )
        if obj.layout != torch.strided or obj.is_nested:
            raise PayloadError(
                f"{self.where()} is a torch tensor with layout {obj.layout}; a payload carries dense tensors: "
                "call .to_dense() first"
            )
        if obj.device.type == "meta":
            raise PayloadError(
                f"{self.where()} is a torch tensor on the meta device, which has no data; materialise it first"
            )
        try:
            tensor = obj.detach()
            if tensor.device.type != "cpu":
                tensor = tensor.cpu()
            if tensor.is_conj():
                tensor = tensor.resolve_conj()
            if tensor.is_neg():
                tensor = tensor.resolve_neg()
            tensor = tensor.contiguous()
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes == 0:
                view = memoryview(b"")
            else:
                memory = (ctypes.c_char * nbytes).from_address(tensor.data_ptr())
                memory._omni_owner = tensor  # keeps the tensor alive as long as the view
                view = memoryview(memory).cast("B")
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            raise PayloadError(
                f"{self.where()} is a torch tensor whose data cannot be read on the host ({exc}); "
                "copy it to a dense CPU tensor first"
            ) from exc
        return ["T", self.add(view), name, list(tensor.shape)]


# -- decoding ------------------------------------------------------------------------------------


def _prefix(view: memoryview) -> tuple[int, int]:
    """The header length and the frame length, from a frame's first bytes."""
    if view.nbytes < PREFIX_SIZE:
        raise PayloadError(
            f"not a payload frame: {view.nbytes} bytes, shorter than the {PREFIX_SIZE}-byte prefix; {_NOT_A_FRAME}"
        )
    magic, version, flags, header_len, total = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise PayloadError(f"not a payload frame: it starts with {magic!r}, not {MAGIC!r}; {_NOT_A_FRAME}")
    if version != VERSION:
        raise PayloadError(
            f"payload frame of format version {version}; this omni reads version {VERSION}: run the same omni "
            "version in every stage of a pipeline"
        )
    if flags != 0:
        raise PayloadError(f"payload frame with flags {flags:#06x}; version {VERSION} frames have none. {_NOT_A_FRAME}")
    if total < PREFIX_SIZE + header_len:
        raise PayloadError(
            f"malformed payload frame: its header of {header_len:,} bytes does not fit in its length of "
            f"{total:,} bytes; {_NOT_A_FRAME}"
        )
    return header_len, total


def frame_size(frame: bytes | bytearray | memoryview) -> int:
    """The total length of the frame ``frame`` starts with, read from its first
    :data:`PREFIX_SIZE` bytes (the rest need not be there yet); :class:`PayloadError` if
    ``frame`` does not start with a frame's prefix."""
    return _prefix(_byte_view(frame, "a payload frame"))[1]


def decode(frame: bytes | bytearray | memoryview, *, copy: bool = False) -> Any:
    """The payload in ``frame`` (which may go on past the frame's end).

    ``copy=False``: numpy arrays and torch tensors view ``frame`` (keeping it alive); from an
    immutable frame they must not be written to. ``copy=True``: they own their memory.
    Raises :class:`PayloadError` for anything that is not a well-formed frame.
    """
    view = _byte_view(frame, "a payload frame")
    header_len, total = _prefix(view)
    if view.nbytes < total:
        raise PayloadError(
            f"truncated payload frame: {view.nbytes:,} bytes, but its prefix says {total:,}; "
            "pass the whole frame (frame_size() reads its length)"
        )
    view = view[:total]
    try:
        header = json.loads(bytes(view[PREFIX_SIZE : PREFIX_SIZE + header_len]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PayloadError(f"malformed payload frame: its header is not JSON ({exc}); {_NOT_A_FRAME}") from None
    if type(header) is not dict or set(header) != {"buffers", "root"}:
        raise PayloadError(
            'malformed payload frame: its header is not an object of "buffers" and "root"; ' + _NOT_A_FRAME
        )
    lengths = header["buffers"]
    if type(lengths) is not list or not all(type(n) is int and n >= 0 for n in lengths):
        raise PayloadError(
            'malformed payload frame: its header\'s "buffers" is not a list of byte lengths; ' + _NOT_A_FRAME
        )
    offsets, expected = _layout(header_len, lengths)
    if expected != total:
        raise PayloadError(
            f"malformed payload frame: its {len(lengths)} buffer(s) end at byte {expected:,}, but the frame is "
            f"{total:,} bytes; {_NOT_A_FRAME}"
        )
    buffers = [view[offset : offset + n] for offset, n in zip(offsets, lengths, strict=True)]
    return _Decoder(buffers, copy=copy).node(header["root"], 0)


def loads(frame: bytes | bytearray | memoryview) -> Any:
    """``decode(frame, copy=True)``: every array and tensor owns its memory."""
    return decode(frame, copy=True)


class _Decoder:
    def __init__(self, buffers: list[memoryview], *, copy: bool) -> None:
        self.buffers = buffers
        self.copy = copy
        self.path: list[Any] = []

    def malformed(self, what: str) -> PayloadError:
        return PayloadError(f"malformed payload frame: {what} at {_where(self.path)}; {_NOT_A_FRAME}")

    def node(self, node: Any, depth: int) -> Any:
        cls = type(node)
        if node is None or cls is bool or cls is int or cls is float or cls is str:
            return node
        if cls is not list or not node or type(node[0]) is not str:
            raise self.malformed(f"a node that is {_describe(node)} {node!r:.60}, not a value or a tagged list")
        tag = node[0]
        if tag in ("l", "t", "d"):
            return self.container(node, depth)
        if tag == "I":
            return self.big_int(node)
        if tag == "b":
            self.arity(node, 2)
            return bytes(self.buffer(node[1]))
        if tag in ("a", "s"):
            return self.numpy(node)
        if tag == "T":
            return self.tensor(node)
        raise self.malformed(f"an unknown node tag {tag!r:.20}")

    def arity(self, node: list[Any], n: int) -> None:
        if len(node) != n:
            raise self.malformed(f"a {node[0]!r} node of {len(node)} items instead of {n}")

    def big_int(self, node: list[Any]) -> int:
        self.arity(node, 2)
        digits = node[1]
        if type(digits) is not str or not _HEX.fullmatch(digits):
            raise self.malformed(f"an int node whose digits {digits!r:.40} are not hexadecimal")
        return int(digits, 16)

    def container(self, node: list[Any], depth: int) -> Any:
        self.arity(node, 2)
        items = node[1]
        if type(items) is not list:
            raise self.malformed(f"a {node[0]!r} node whose items are not a list")
        if depth >= MAX_DEPTH:
            raise self.malformed(f"containers nested more than {MAX_DEPTH} deep")
        path = self.path
        if node[0] == "d":
            if len(items) % 2:
                raise self.malformed("a dict node with a key and no value")
            out: dict[Any, Any] = {}
            for i in range(0, len(items), 2):
                key = items[i]
                if type(key) is list and key and key[0] == "I":
                    key = self.big_int(key)
                elif type(key) is not str and type(key) is not int:
                    raise self.malformed(f"a dict key {key!r:.40} that is not a string or an int")
                if key in out:
                    raise self.malformed(f"the dict key {key!r:.40} twice")
                path.append(key)
                out[key] = self.node(items[i + 1], depth + 1)
                path.pop()
            return out
        values = []
        path.append(0)
        for i, item in enumerate(items):
            if type(item) is list:
                path[-1] = i
                item = self.node(item, depth + 1)
            elif type(item) is dict:
                path[-1] = i
                self.node(item, depth + 1)  # raises
            values.append(item)
        path.pop()
        return values if node[0] == "l" else tuple(values)

    def buffer(self, index: Any) -> memoryview:
        if type(index) is not int or not 0 <= index < len(self.buffers):
            raise self.malformed(f"a buffer index {index!r:.20} out of range (the frame has {len(self.buffers)})")
        return self.buffers[index]

    def shape(self, shape: Any) -> tuple[int, ...]:
        if type(shape) is not list or len(shape) > _MAX_DIMS or not all(type(n) is int and n >= 0 for n in shape):
            raise self.malformed(f"a shape {shape!r:.60} that is not a list of at most {_MAX_DIMS} sizes")
        return tuple(shape)

    def sized(self, buffer: memoryview, shape: tuple[int, ...], itemsize: int, dtype: str) -> None:
        count = 1
        for n in shape:
            count *= n
        if count * itemsize != buffer.nbytes:
            raise self.malformed(
                f"an array of shape {list(shape)} and dtype {dtype} ({count * itemsize:,} bytes) "
                f"in a buffer of {buffer.nbytes:,} bytes"
            )

    def import_(self, module: str, what: str) -> Any:
        try:
            return __import__(module)
        except ImportError:
            raise PayloadError(
                f"{_where(self.path)} is {what}, but {module} cannot be imported in this process: install it in "
                "this stage's environment"
            ) from None

    def numpy(self, node: list[Any]) -> Any:
        np = self.import_("numpy", "a numpy array")
        scalar = node[0] == "s"
        self.arity(node, 4)
        buffer = self.buffer(node[1])
        spec = node[2]
        try:
            if type(spec) is not str or (scalar and type(node[3]) is not str):
                raise TypeError
            dtype = np.dtype(node[3] if scalar else spec)
        except Exception:  # numpy raises TypeError, ValueError or SyntaxError for a bad spec
            raise self.malformed(f"an unknown numpy dtype {spec!r:.30}") from None
        if dtype.str != spec or not _numpy_dtype_ok(dtype):
            raise self.malformed(f"the numpy dtype {spec!r:.30}, which a payload does not carry")
        shape = () if scalar else self.shape(node[3])
        self.sized(buffer, shape, dtype.itemsize, spec)
        if dtype.kind == "b" and buffer.nbytes and int(np.frombuffer(buffer, dtype=np.uint8).max()) > 1:
            raise self.malformed("a bool array holding bytes other than 0 and 1")
        array = np.frombuffer(buffer, dtype=dtype)
        if scalar:
            return array[0]
        array = array.reshape(shape)
        return array.copy() if self.copy else array

    def tensor(self, node: list[Any]) -> Any:
        torch = self.import_("torch", "a torch tensor")
        self.arity(node, 4)
        buffer = self.buffer(node[1])
        name = node[2]
        if type(name) is not str or name not in _TORCH_DTYPES:
            raise self.malformed(f"the torch dtype {name!r:.30}, which a payload does not carry")
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise PayloadError(
                f"{_where(self.path)} is a torch tensor of dtype {name}, which torch {torch.__version__} lacks: "
                "run the same torch version in every stage of a pipeline"
            )
        shape = self.shape(node[3])
        self.sized(buffer, shape, dtype.itemsize, name)
        if buffer.nbytes == 0:
            return torch.empty(shape, dtype=dtype)  # torch.frombuffer refuses empty buffers
        if buffer.readonly:
            # torch has no read-only tensors and warns; the module docstring says not to write to them
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
                raw = torch.frombuffer(buffer, dtype=torch.uint8)
        else:
            raw = torch.frombuffer(buffer, dtype=torch.uint8)
        if dtype == torch.bool and int(raw.max()) > 1:
            raise self.malformed("a bool tensor holding bytes other than 0 and 1")
        tensor = (raw if dtype == torch.uint8 else raw.view(dtype)).reshape(shape)
        return tensor.clone() if self.copy else tensor
