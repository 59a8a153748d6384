"""Hardened GGUF writer (issue 37, session 17): hand-made one-line mutations of
``ds4mlx/gguf/writer.py`` in lines no earlier set changes: which tensors count towards
``general.file_type`` (float weights only, summed per type, a tie to the type seen first), a
given ``general.quantization_version`` kept, and the type checks of metadata values (a string,
a bool, no bool as a number, float64 not held to float32's range). Each is caught by the
additions to ``tests/gguf/test_writer.py`` (checked with the change applied, and the tests
passing without it).

Test selection as in the fresh sets: the whole ``tests/gguf`` folder, with ``-x``.
"""

from __future__ import annotations

from mutation_sets.base import (
    WRITER_PY,
)
from mutation_sets.base import in_gguf_folder as _gguf

MUTATIONS = (
    _gguf(
        "writer_integer_tables_counted_as_weights",
        WRITER_PY,
        "if qtype not in INTEGER_TYPES:",
        "if qtype is not None:",
    ),
    _gguf(
        "writer_file_type_weights_not_summed",
        WRITER_PY,
        "weights[qtype] += n_elements",
        "weights[qtype] = n_elements",
    ),
    _gguf(
        "writer_file_type_tie_to_the_last",
        WRITER_PY,
        "most = weights.most_common(1)[0][0] if weights else T.F32",
        "most = weights.most_common()[-1][0] if weights else T.F32",
    ),
    _gguf(
        "writer_quantization_version_overwritten",
        WRITER_PY,
        "typed.setdefault(QUANTIZATION_VERSION_KEY, _TypedValue(GGML_QUANT_VERSION, V.UINT32))",
        "typed[QUANTIZATION_VERSION_KEY] = _TypedValue(GGML_QUANT_VERSION, V.UINT32)",
    ),
    _gguf(
        "writer_string_type_takes_any_value",
        WRITER_PY,
        "fits = isinstance(value, str)",
        "fits = True",
    ),
    _gguf(
        "writer_bool_type_takes_ints",
        WRITER_PY,
        "fits = isinstance(value, bool)",
        "fits = isinstance(value, (bool, int))",
    ),
    _gguf(
        "writer_bools_fit_number_types",
        WRITER_PY,
        "fits = isinstance(value, (int, float)) and not isinstance(value, bool)",
        "fits = isinstance(value, (int, float))",
    ),
    _gguf(
        "writer_float64_checked_as_float32",
        WRITER_PY,
        "elif fits and number_type == np.float32:",
        "elif fits and np.issubdtype(number_type, np.floating):",
    ),
)
