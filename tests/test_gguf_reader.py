"""specdec's GGUF reader (models/gguf/reader.py) reads what gguf-py's GGUFReader reads: every field's types and
contents and every tensor's type, shape, offset and bytes, on the bundled model (Q4_1, Q8_0), on a random-weight
Q4_K_M file, and on a file with every metadata value type and F32, F16 and I32 tensors. Malformed files are refused
with one line."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType

from specdec.errors import SpecdecError
from specdec.models.gguf.file import open_gguf
from specdec.models.gguf.reader import GgufReader
from specdec.models.gguf.synth import write


def same_as_gguf_py(path: Path) -> GgufReader:
    ours, theirs = GgufReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for name, f in theirs.fields.items():
        assert ours.fields[name].types == f.types, name
        assert ours.fields[name].contents() == f.contents(), name
    assert ours.data_offset == theirs.data_offset and ours.alignment == theirs.alignment
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist(), a.name
        assert (a.n_elements, a.n_bytes, a.data_offset) == (b.n_elements, b.n_bytes, b.data_offset), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data, equal_nan=True), a.name
    return ours


def test_the_bundled_model_reads_as_gguf_py_reads_it():
    from specdec.models.gguf.convert import bundled_gguf_path

    r = same_as_gguf_py(Path(bundled_gguf_path()))
    assert len(r.fields["tokenizer.ggml.tokens"].contents()) == 49152


def test_a_k_quant_mix_reads_as_gguf_py_reads_it(tmp_path):  # Q4_K_M: Q4_K, Q6_K and Q5_0 or Q8_0 tensors
    same_as_gguf_py(write(tmp_path / "Q4_K_M.gguf", "tiny-llama", "Q4_K_M").path)


def every_value_type(path: Path, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for kind, value in [(GGUFValueType.UINT8, 200), (GGUFValueType.INT8, -100), (GGUFValueType.UINT16, 60000),
                        (GGUFValueType.INT16, -30000), (GGUFValueType.UINT32, 4_000_000_000),
                        (GGUFValueType.INT32, -2_000_000_000), (GGUFValueType.FLOAT32, 1e-5),
                        (GGUFValueType.UINT64, 2**63 + 5), (GGUFValueType.INT64, -(2**62)),
                        (GGUFValueType.FLOAT64, 0.1), (GGUFValueType.BOOL, True), (GGUFValueType.STRING, "naïve ✓")]:
        w.add_key_value(f"test.{kind.name.lower()}", value, kind)
    w.add_key_value("test.strings", ["", "a", "日本語", "<|im_end|>"], GGUFValueType.ARRAY,
                    sub_type=GGUFValueType.STRING)
    w.add_key_value("test.floats", [0.5, -2.0, 3.25], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    w.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b", np.arange(5, dtype=np.float16))
    w.add_tensor("c", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_reads_as_gguf_py_reads_it(tmp_path, alignment):
    r = same_as_gguf_py(every_value_type(tmp_path / "values.gguf", alignment))
    assert r.fields["test.strings"].contents() == ["", "a", "日本語", "<|im_end|>"]
    assert r.fields["test.floats"].types == [GGUFValueType.ARRAY, GGUFValueType.FLOAT32]
    assert r.tensors[0].data.tolist() == np.arange(12).reshape(3, 4).tolist()


def test_malformed_files_are_refused_with_one_line(tmp_path):
    whole = every_value_type(tmp_path / "whole.gguf").read_bytes()
    r = GgufReader(tmp_path / "whole.gguf")
    last = r.tensors[-1].data_offset + r.tensors[-1].n_bytes  # the file's padding runs on after it
    for cut in (8, 40, r.data_offset - 10, last - 1):  # in the counts, the metadata, the tensor table, the data
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(whole[:cut])
        with pytest.raises(SpecdecError, match="malformed or truncated GGUF file") as e:
            open_gguf(bad)
        assert "\n" not in str(e.value)
    swapped = tmp_path / "swapped.gguf"
    swapped.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + whole[8:])
    with pytest.raises(SpecdecError, match="big-endian"):
        open_gguf(swapped)
