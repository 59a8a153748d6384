"""Hardened GGUF reader and quants, and speculation's drafter files (issue 37, session 18):
hand-made one-line mutations of lines no earlier set changes, each caught by a test added in
``tests/gguf`` or ``tests/speculation`` (checked with the change applied, and the tests passing
without it). The GGUF side: the load counts and progress ``GGUFFile`` reports, the pages it
unmaps, nested metadata arrays, and the "native" conversions Metal uses (run on the CPU with its
blocks turned off).

Test selection as in the fresh sets: the whole ``tests/`` folder of the mutated package, with
``-x``.

The 4 entries found identical to fresh9's (written the same afternoon by the
blind writer, who never saw these) were taken out of this set: fresh9 keeps them.
"""

from __future__ import annotations

from mutation_sets.base import (
    DSPARK_LAYOUT_PY,
    DSPARK_PY,
    GGUF_READER_PY,
    MTP_PY,
    NEXTN_PY,
    QUANTS_PY,
    SUPPORT_GGUF_PY,
    WRITER_PY,
)
from mutation_sets.base import in_gguf_folder as _gguf
from mutation_sets.base import in_speculation_folder as _speculation

_READER = (
    _gguf(
        "reader_mapped_tensor_not_reported",
        GGUF_READER_PY,
        "            self.mapped_tensors += 1\n            self.mark_loaded(name)\n",
        "            self.mapped_tensors += 1\n",
    ),
    _gguf(
        "reader_conversion_seconds_not_summed",
        GGUF_READER_PY,
        "self.conversion_seconds += time.perf_counter() - start",
        "self.conversion_seconds = time.perf_counter() - start",
    ),
    _gguf(
        "reader_progress_called_without_a_callback",
        GGUF_READER_PY,
        "        if self.on_tensor_loaded is not None:\n",
        "        if True:\n",
    ),
    _gguf(
        "reader_madvise_from_the_tensor_not_its_page",
        GGUF_READER_PY,
        "start = info.file_offset - info.file_offset % mmap.PAGESIZE",
        "start = info.file_offset",
    ),
    _gguf(
        "reader_last_tensor_pages_kept",
        GGUF_READER_PY,
        "if length > 0 and start + length <= len(self.mapping):",
        "if length > 0 and start + length < len(self.mapping):",
    ),
    _gguf(
        "reader_madvise_check_inverted",
        GGUF_READER_PY,
        'if not hasattr(mmap, "MADV_DONTNEED"):',
        'if hasattr(mmap, "MADV_DONTNEED"):',
    ),
    _gguf(
        "reader_nested_array_offset_not_advanced",
        GGUF_READER_PY,
        "        value, offset = _metadata_value(buffer, item_type, offset)\n",
        "        value, _ = _metadata_value(buffer, item_type, offset)\n",
    ),
    _gguf(
        "reader_mmap_error_names_errno",
        GGUF_READER_PY,
        'raise GGUFError(f"{self.path}: cannot read file: {exc.strerror or exc}") from exc',
        'raise GGUFError(f"{self.path}: cannot read file: {exc}") from exc',
    ),
    _gguf(
        "reader_blocks_never_mapped",
        GGUF_READER_PY,
        "    if native_ops().mapping_supported():\n        return True\n",
        "    if native_ops().mapping_supported():\n        return False\n",
    ),
    _gguf(
        "reader_uint16_read_signed",
        GGUF_READER_PY,
        'GGUFValueType.UINT16: "<H",',
        'GGUFValueType.UINT16: "<h",',
    ),
    _gguf(
        "reader_uint32_read_signed",
        GGUF_READER_PY,
        'GGUFValueType.UINT32: "<I",',
        'GGUFValueType.UINT32: "<i",',
    ),
    _gguf(
        "reader_int64_read_unsigned",
        GGUF_READER_PY,
        'GGUFValueType.INT64: "<q",',
        'GGUFValueType.INT64: "<Q",',
    ),
    _gguf(
        "reader_float64_read_as_float32",
        GGUF_READER_PY,
        'GGUFValueType.FLOAT64: "<d",',
        'GGUFValueType.FLOAT64: "<f",',
    ),
    _gguf(
        "reader_i16_tensor_as_bytes",
        GGUF_READER_PY,
        "    GGMLQuantizationType.I16: np.int16,\n",
        "",
    ),
    _gguf(
        "reader_f64_tensor_as_bytes",
        GGUF_READER_PY,
        "    GGMLQuantizationType.F64: np.float64,\n",
        "",
    ),
)

_QUANTS = (
    _gguf(
        "quants_metal_small_models_expanded",
        QUANTS_PY,
        '    if DEFAULT_WEIGHT_MODE == "native":\n',
        '    if DEFAULT_WEIGHT_MODE == "f32":\n',
    ),
    _gguf(
        "quants_unknown_weight_mode_accepted",
        QUANTS_PY,
        "    if mode not in WEIGHT_MODES:\n",
        "    if mode is None:\n",
    ),
    _gguf(
        "quants_chunk_of_no_rows",
        QUANTS_PY,
        "rows_per_chunk = max(1, CHUNK_BYTES // (n_blocks * type_size))",
        "rows_per_chunk = CHUNK_BYTES // (n_blocks * type_size)",
    ),
    _gguf(
        "quants_chunks_written_over_the_first",
        QUANTS_PY,
        "output[start : start + len(part)] = part",
        "output[: len(part)] = part",
    ),
    _gguf(
        "quants_bf16_bits_read_as_float16",
        QUANTS_PY,
        "arrays = [mx.view(arrays[0], mx.bfloat16)]",
        "arrays = [mx.view(arrays[0], mx.float16)]",
    ),
    _gguf(
        "quants_q4_0_bias_off_by_one",
        QUANTS_PY,
        "return _nibbles_to_mlx(blocks[..., 2:], 16), d, -8 * d",
        "return _nibbles_to_mlx(blocks[..., 2:], 16), d, -7 * d",
    ),
    _gguf(
        "quants_q8_0_bias_off_by_one",
        QUANTS_PY,
        "view(np.uint32), d, -128 * d",
        "view(np.uint32), d, -127 * d",
    ),
    _gguf(
        "quants_high_nibbles_misplaced",
        QUANTS_PY,
        "out[:, :, 1] = ((words >> 4) & 0x0F) | ((words >> 8) & 0xF0)",
        "out[:, :, 1] = ((words >> 4) & 0x0F) | ((words >> 4) & 0xF0)",
    ),
    _gguf(
        "quants_q4_k_min_added",
        QUANTS_PY,
        "    biases = -(dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32))\n",
        "    biases = dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32)\n",
    ),
    _gguf(
        "quants_mxfp4_scale_from_a_code_byte",
        QUANTS_PY,
        "return _nibbles_to_mlx(blocks[..., 1:], 16), blocks[..., 0]",
        "return _nibbles_to_mlx(blocks[..., 1:], 16), blocks[..., 1]",
    ),
    _gguf(
        "quants_q8_0_as_4_bits",
        QUANTS_PY,
        'T.Q8_0: (_q8_0, 8, "affine"),',
        'T.Q8_0: (_q8_0, 4, "affine"),',
    ),
    _gguf(
        "quants_empty_matrix_converted",
        QUANTS_PY,
        "is_matrix = len(shape) >= 2 and raw.size > 0",
        "is_matrix = len(shape) >= 2 and raw.size >= 0",
    ),
    _gguf(
        "quants_inexact_codes_kept",
        QUANTS_PY,
        "    if not np.array_equal(scale * codes.astype(np.float32) + bias, flat):\n",
        "    if False:\n",
    ),
    _gguf(
        "quants_q2_k_codes_scale_from_the_minimum",
        QUANTS_PY,
        "d, dmin = _f16(blocks, 80)[..., None], _f16(blocks, 82)[..., None]",
        "d, dmin = _f16(blocks, 82)[..., None], _f16(blocks, 80)[..., None]",
    ),
    _gguf(
        "quants_q6_k_codes_scales_unsigned",
        QUANTS_PY,
        "sc = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)",
        "sc = blocks[..., 192:208].copy().astype(np.float32)",
    ),
    _gguf(
        "quants_q4_k_codes_minimum_added",
        QUANTS_PY,
        "return scale, -(dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32))",
        "return scale, dmin * m.reshape(n_rows, n_blocks, 8).astype(np.float32)",
    ),
)

_WRITER = (
    _gguf(
        "writer_empty_typed_array_reaches_gguf_writer",
        WRITER_PY,
        "-> _TypedValue:\n    if not items:\n",
        "-> _TypedValue:\n    if False:\n",
    ),
)

_SUPPORT = (
    _speculation(
        "support_last_window_short_of_the_end",
        SUPPORT_GGUF_PY,
        "    last = nbytes - HASH_WINDOW_BYTES\n",
        "    last = nbytes - HASH_WINDOW_BYTES - 1\n",
    ),
    _speculation(
        "support_identity_ignores_the_type",
        SUPPORT_GGUF_PY,
        'header = f"{info.name}\\0{info.qtype.name}\\0{list(info.shape)}\\0{info.nbytes}\\0"',
        'header = f"{info.name}\\0{list(info.shape)}\\0{info.nbytes}\\0"',
    ),
    _speculation(
        "support_identity_ignores_the_shape",
        SUPPORT_GGUF_PY,
        'header = f"{info.name}\\0{info.qtype.name}\\0{list(info.shape)}\\0{info.nbytes}\\0"',
        'header = f"{info.name}\\0{info.qtype.name}\\0{info.nbytes}\\0"',
    ),
    _speculation(
        "support_target_file_recorded_with_its_folder",
        SUPPORT_GGUF_PY,
        "TARGET_FILE_KEY: MetaValue(Path(target.path).name, GGUFValueType.STRING),",
        "TARGET_FILE_KEY: MetaValue(str(target.path), GGUFValueType.STRING),",
    ),
    _speculation(
        "support_tokenizer_values_retyped",
        SUPPORT_GGUF_PY,
        "out[key] = MetaValue(value, target.writer_type(key))",
        "out[key] = MetaValue(value, GGUFValueType.STRING if isinstance(value, str) else "
        "GGUFValueType.INT32)",
    ),
    _speculation(
        "support_unrecorded_identity_checked",
        SUPPORT_GGUF_PY,
        "    if expected is None:\n        return\n",
        "    if expected is None:\n        expected = ''\n",
    ),
    _speculation(
        "support_refusal_without_the_trained_for_default",
        SUPPORT_GGUF_PY,
        'trained_for = support.get(TARGET_FILE_KEY, "another model")',
        "trained_for = support.get(TARGET_FILE_KEY)",
    ),
    _speculation(
        "support_refusal_shows_the_whole_identity",
        SUPPORT_GGUF_PY,
        'f"{str(expected)[:16]}...) than {target.path} (identity {actual[:16]}...); "',
        'f"{expected}...) than {target.path} (identity {actual[:16]}...); "',
    ),
    _speculation(
        "support_arch_check_lists_descriptions_only",
        SUPPORT_GGUF_PY,
        """expected = ", ".join(f"'{a}' ({what})" for a, what in allowed.items())""",
        """expected = ", ".join(f"({what})" for a, what in allowed.items())""",
    ),
    _speculation(
        "support_biases_random",
        SUPPORT_GGUF_PY,
        'if name.endswith(("sinks.weight", ".bias", "_base.weight")):',
        'if name.endswith(("sinks.weight", "_base.weight")):',
    ),
    _speculation(
        "support_mhc_scales_unit",
        SUPPORT_GGUF_PY,
        "return np.full(shape, 0.1, np.float32)",
        "return np.full(shape, 1.0, np.float32)",
    ),
    _speculation(
        "support_matmul_variance_of_fan_out",
        SUPPORT_GGUF_PY,
        "return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)",
        "return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)",
    ),
    _speculation(
        "support_confidence_projection_quantized",
        SUPPORT_GGUF_PY,
        '("_fn.weight", "conf_proj.weight", "confidence_head.proj.weight")',
        '("_fn.weight", "confidence_head.proj.weight")',
    ),
    _speculation(
        "support_partial_blocks_quantized",
        SUPPORT_GGUF_PY,
        "if is_matrix and shape[-1] % block == 0:",
        "if is_matrix:",
    ),
    _speculation(
        "support_given_types_ignored",
        SUPPORT_GGUF_PY,
        "types[name] if name in types else storage_type(name, array.shape, matrix_type),",
        "storage_type(name, array.shape, matrix_type),",
    ),
    _speculation(
        "support_matrix_type_ignored",
        SUPPORT_GGUF_PY,
        "types[name] if name in types else storage_type(name, array.shape, matrix_type),",
        "types[name] if name in types else storage_type(name, array.shape),",
    ),
)

_DRAFTERS = (
    _speculation(
        "mtp_largest_draft_refused",
        MTP_PY,
        "        if not 1 <= max_draft <= MAX_DRAFT:\n",
        "        if not 1 <= max_draft < MAX_DRAFT:\n",
    ),
    _speculation(
        "mtp_empty_draft_limit_accepted",
        MTP_PY,
        "        if not 1 <= max_draft <= MAX_DRAFT:\n",
        "        if not 0 <= max_draft <= MAX_DRAFT:\n",
    ),
    _speculation(
        "mtp_mismatched_rows_accepted",
        MTP_PY,
        "        if len(tokens) != rows.n_rows:\n"
        '            raise ValueError(f"{len(tokens)} tokens but {rows.n_rows} target rows")\n'
        "        if self._next_pos is not None and rows.pos0 != self._next_pos:\n",
        "        if self._next_pos is not None and rows.pos0 != self._next_pos:\n",
    ),
    _speculation(
        "dspark_device_draft_before_an_observe",
        DSPARK_PY,
        "        if n <= 0 or self._next_token is None:\n            return None\n",
        "        if n <= 0:\n            return None\n",
    ),
    _speculation(
        "dspark_pending_rows_kept_at_the_window",
        DSPARK_PY,
        "while len(self._pending) > 1 and later >= self.net.window:",
        "while len(self._pending) > 1 and later > self.net.window:",
    ),
    _speculation(
        "nextn_block_looked_for_in_the_last_layer",
        NEXTN_PY,
        'block = f"blk.{args.num_layers}.nextn.eh_proj.weight"',
        'block = f"blk.{args.num_layers - 1}.nextn.eh_proj.weight"',
    ),
    _speculation(
        "nextn_refusal_without_the_layer_count",
        NEXTN_PY,
        "f\"{gguf.get(f'{gguf.arch}.nextn_predict_layers', 0)}, no tensor \"",
        "f\"{gguf.get('nextn_predict_layers', 0)}, no tensor \"",
    ),
    _speculation(
        "nextn_any_architecture_drafts",
        NEXTN_PY,
        "    if gguf.arch != glm5_next.ARCH:\n",
        "    if gguf.arch == 'deepseek4':\n",
    ),
    _speculation(
        "nextn_network_without_block_accepted",
        NEXTN_PY,
        "        if network.mtp is None:\n",
        "        if network is None:\n",
    ),
    _speculation(
        "dflash_bonus_anchor_not_written",
        DSPARK_LAYOUT_PY,
        "        if not config.sample_from_anchor:\n",
        "        if config.sample_from_anchor is None:\n",
    ),
    _speculation(
        "convert_missing_bias_fails",
        DSPARK_LAYOUT_PY,
        "        if not gguf.has_tensor(stored):\n"
        "            continue  # the optional confidence bias\n",
        "",
    ),
    _speculation(
        "convert_d2t_dequantized",
        DSPARK_LAYOUT_PY,
        "        if name == D2T:\n",
        "        if name == 'D2T':\n",
    ),
    _speculation(
        "dflash_ninth_unknown_tensor_unmarked",
        DSPARK_LAYOUT_PY,
        '+ (" ..." if len(unknown) > 8 else "")',
        '+ (" ..." if len(unknown) > 9 else "")',
    ),
    _speculation(
        "dflash_eight_unknown_tensors_marked_as_more",
        DSPARK_LAYOUT_PY,
        '+ (" ..." if len(unknown) > 8 else "")',
        '+ (" ..." if len(unknown) >= 8 else "")',
    ),
    _speculation(
        "dflash_any_output_length_refused",
        DSPARK_LAYOUT_PY,
        "    if out is not None and int(out) != args.hidden_size:\n",
        "    if out is not None:\n",
    ),
)

MUTATIONS = (*_READER, *_QUANTS, *_WRITER, *_SUPPORT, *_DRAFTERS)
