"""Decoding tar samples as webdataset's ``WebDataset(...).decode(*specs)`` decodes them.

webdataset's `decode` (compat.py) turns each string spec into an
``autodecode.ImageHandler(spec)`` ("pil", "rgb8", "torchrgb", "l", ...), takes anything
else as a handler ``handler(key, data) -> value or None``, and builds
``autodecode.Decoder(handlers)``, whose defaults add a gzip pre-handler and its basic
handlers (txt, cls, json, npy, ...) last. `make_decoder` builds the same Decoder, but checks
the specs first, so that a wrong one fails in the dataset's constructor (ValueError or
TypeError naming it) rather than later in a reader thread.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ShardError
from ...storage.filesystems import redact

__all__ = ["DecodeSpec", "SafeBasicHandlers", "SampleDecoder", "make_decoder"]

Handler = Callable[[str, bytes], Any]
# False/None: bytes; True: webdataset's basic handlers; an image spec, a handler, a list of
# them; or a ready webdataset.autodecode.Decoder (called on the whole sample)
DecodeSpec = bool | str | Handler | Sequence[str | Handler] | None


class SampleDecoder:
    """Calls a webdataset Decoder on a sample; an error names the shard, the sample's key
    and the field (webdataset's DecodingError carries no message). Picklable when the
    handlers are (webdataset's are), so spawned DataLoader workers can take it."""

    def __init__(self, decoder: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.decoder = decoder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.decoder(sample)
        except Exception as e:
            cause = e.__cause__ if type(e).__name__ == "DecodingError" and e.__cause__ else e
            field = getattr(e, "k", None)
            where = f"field {field!r} of sample" if field else "sample"
            raise ShardError(
                f"{redact(str(sample.get('__url__')))}: cannot decode {where} "
                f"{sample.get('__key__')!r}: {type(cause).__name__}: {cause}"
            ) from e


PICKLED = ("pyd", "pkl", "pickle")  # webdataset's basic handlers unpickle these


class SafeBasicHandlers:
    """webdataset's basic handlers (txt, cls, json, npy, ...; its ``basichandlers``), except
    that without `allow_pickle` a pickled member is refused (unpickling runs whatever
    code the shard's author put there) and ``.pth`` loads with ``weights_only=True``
    (torch's safe loader: tensors and plain containers only). ``.npy``/``.npz`` go to
    numpy's loaders, which refuse pickled object arrays by default. webdataset's own switch
    (``webdataset.utils.enforce_security``) is global and off by default; this is per
    dataset and on by default."""

    def __init__(self, allow_pickle: bool = False) -> None:
        self.allow_pickle = allow_pickle

    def __call__(self, key: str, data: bytes) -> Any:
        from webdataset import autodecode

        extension = key.rsplit(".", 1)[-1].lower()
        if not self.allow_pickle:
            if extension in PICKLED:
                raise ValueError(
                    f"a pickled member (.{extension}) can run any code when loaded; pass "
                    "allow_pickle=True if you trust this data's author, or decode it "
                    "yourself (decode=False gives the bytes)"
                )
            if extension == "pth":
                import io

                import torch

                return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        return autodecode.basichandlers(key, data)


def make_decoder(decode: object, allow_pickle: bool = False) -> SampleDecoder | None:
    """The decoder `decode` asks for, checked now; None when it asks for none.

    False or None: none (samples keep bytes). True: webdataset's basic handlers, as
    ``.decode()`` with no arguments. A str, a handler or a list/tuple of them: as
    ``.decode(*specs)``; a str must be one of webdataset's image specs (ValueError
    listing them), a handler must take (key, data) (TypeError otherwise). A
    ``webdataset.autodecode.Decoder`` is used as it is (its handlers are the caller's
    choice). The basic handlers refuse pickles unless `allow_pickle` (SafeBasicHandlers).
    """
    if decode is None or decode is False:
        return None
    from webdataset import autodecode

    if isinstance(decode, autodecode.Decoder):
        return SampleDecoder(decode)
    if decode is True:
        specs: list[object] = []
    elif isinstance(decode, str) or callable(decode):
        specs = [decode]
    elif isinstance(decode, list | tuple):
        specs = list(decode)
    else:
        raise TypeError(
            f"decode must be True, an image spec such as 'pil', a handler(key, data), or a "
            f"list of them, got {decode!r} ({type(decode).__name__})"
        )
    handlers = [_handler(spec, autodecode) for spec in specs]
    post = [SafeBasicHandlers(allow_pickle)]
    return SampleDecoder(autodecode.Decoder(handlers, post=post))


def _handler(spec: object, autodecode: Any) -> Handler:
    """One of webdataset's decode arguments as a handler, checked."""
    if isinstance(spec, str):
        if spec not in autodecode.imagespecs:
            raise ValueError(
                f"decode: unknown image spec {spec!r}; webdataset's are "
                f"{sorted(autodecode.imagespecs)}"
            )
        handler: Handler = autodecode.ImageHandler(spec)
        return handler
    if isinstance(spec, bool) or not callable(spec):
        raise TypeError(
            f"decode: {spec!r} ({type(spec).__name__}) is neither an image spec (str) nor "
            "a handler(key, data)"
        )
    try:
        inspect.signature(spec).bind(".ext", b"")
    except TypeError:
        raise TypeError(
            f"decode: handler {spec!r} cannot be called as handler(key, data), as webdataset "
            "calls decoders (key: the field's extension with a leading dot, data: its "
            "bytes; return the value, or None to leave the field to the next handler). "
            "To change whole samples, map the records yourself"
        ) from None
    except ValueError:
        pass  # no signature to check (some builtins): trust it
    return spec
