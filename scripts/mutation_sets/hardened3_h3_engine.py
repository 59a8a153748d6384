"""Hardened engine, third pass (issue 37, session 19): hand-made one-line mutations of
``ds4mlx/engine`` outside ``chat/`` on lines no earlier set mutates: the prompt cache's tiers,
the snapshot files and the model fingerprint that keys them, the state codec, the generation
loop, the session, the detokenizer, the tokenizer and the sampler. Each was
applied by hand and run against the test files meant to catch it; the ones none caught got a
test (``tests/engine/test_model_fingerprint.py``, ``test_prompt_cache_disk_files.py``, and
additions to ``test_kv_snapshots.py``, ``test_generation_loop.py``, ``test_sampler_filters.py``,
``test_tokenizer.py``). Not yet checked: the constraints' ``CallConstraint`` phases and the
llguidance tokenizer view (their subset of the folder's tests missed four mutations there; the
whole folder was not run on them).

Left out as equivalent: a queued run's stop looked for before its last token only (the last
token is never fed, so the cut changes nothing); ``MemoryTier.get`` returning the ``None`` it
found; ``Session.feed`` without its float32 cast (the models' logits are float32 already);
``common_prefix``'s early return for empty lists (numpy gives the same 0); top-p applied at 1.0;
the penalties run over an empty window; ``top is None`` for ``not top`` in ``logprob_arrays``;
an unknown token type read as NORMAL rather than UNDEFINED (both decode byte-level); added
tokens marked normalized (the tokenizer has no normalizer); the token-bytes cache not stored;
the converter's round trip of non-normalized added tokens (it gives their text back).

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.

The 2 entries found identical to fresh10's (written the same evening by the blind writer, who
never saw this set) were taken out of this set: fresh10 keeps them.
"""

from __future__ import annotations

from mutation_sets import base as paths
from mutation_sets.base import in_engine_folder as _engine

MUTATIONS = (
    # prompt cache: memory and disk tiers
    _engine(
        "kvcache_rollback_length_adds_the_share",
        paths.PROMPT_CACHE_PY,
        "return len(self.tokens) - self.share",
        "return len(self.tokens) + self.share",
    ),
    _engine(
        "kvcache_memory_eviction_keeps_counting_the_evicted",
        paths.PROMPT_CACHE_PY,
        "            self.used -= evicted\n",
        "",
    ),
    _engine(
        "kvcache_memory_use_set_to_the_last_entry",
        paths.PROMPT_CACHE_PY,
        "        self.used += size\n",
        "        self.used = size\n",
    ),
    _engine(
        "kvcache_rollback_of_four_tokens_refused",
        paths.PROMPT_CACHE_PY,
        "MAX_CUT = 4",
        "MAX_CUT = 3",
    ),
    _engine(
        "kvcache_file_name_of_16_bits",
        paths.PROMPT_CACHE_PY,
        "digest.hexdigest()[:40]",
        "digest.hexdigest()[:4]",
    ),
    _engine(
        "kvcache_folder_named_like_a_snapshot_read_as_one",
        paths.PROMPT_CACHE_PY,
        "if p.is_file()]",
        "]",
    ),
    _engine(
        "kvcache_stale_temporary_file_kept",
        paths.PROMPT_CACHE_PY,
        "                    temporary.unlink()\n",
        "                    pass\n",
    ),
    _engine(
        "kvcache_temporary_files_kept_ten_times_longer",
        paths.PROMPT_CACHE_PY,
        "_STALE_TEMPORARY_SECONDS = 600.0",
        "_STALE_TEMPORARY_SECONDS = 6000.0",
    ),
    _engine(
        "kvcache_unreadable_file_at_start_not_removed",
        paths.PROMPT_CACHE_PY,
        "                self._refuse(path, str(exc))\n                continue\n",
        "                continue\n",
    ),
    _engine(
        "kvcache_unreadable_file_refused_only_when_gone",
        paths.PROMPT_CACHE_PY,
        "            if path.exists():\n                self._refuse(path, str(exc))\n",
        "            if not path.exists():\n                self._refuse(path, str(exc))\n",
    ),
    _engine(
        "kvcache_file_with_changed_tokens_kept",
        paths.PROMPT_CACHE_PY,
        '            self._refuse(path, f"{path}: its tokens changed since it was indexed")\n',
        "",
    ),
    _engine(
        "kvcache_usage_counts_the_last_file_only",
        paths.PROMPT_CACHE_PY,
        "total += path.stat().st_size",
        "total = path.stat().st_size",
    ),
    _engine(
        "kvcache_estimate_without_header_slack",
        paths.PROMPT_CACHE_PY,
        "+ 16 * len(snapshot.tokens) + 65536",
        "+ 16 * len(snapshot.tokens)",
    ),
    _engine(
        "kvcache_snapshot_of_the_whole_budget_refused",
        paths.PROMPT_CACHE_PY,
        "        if size > self.budget:\n            self.warn(",
        "        if size >= self.budget:\n            self.warn(",
    ),
    _engine(
        "kvcache_failing_disk_warns_on_every_write",
        paths.PROMPT_CACHE_PY,
        "            if not self._write_failing:\n",
        "            if True:\n",
    ),
    _engine(
        "kvcache_file_evicted_by_its_own_size_reported_saved",
        paths.PROMPT_CACHE_PY,
        "        return path.exists()\n",
        "        return True\n",
    ),
    _engine(
        "kvcache_eviction_never_counts_down",
        paths.PROMPT_CACHE_PY,
        "            total -= size\n",
        "",
    ),
    _engine(
        "kvcache_one_token_state_kept_in_memory",
        paths.PROMPT_CACHE_PY,
        "        if self._usable(snapshot):\n            self._guarded(self.memory.put",
        "        if True:\n            self._guarded(self.memory.put",
    ),
    _engine(
        "kvcache_unusable_state_written_to_disk",
        paths.PROMPT_CACHE_PY,
        "if self.disk is not None and self._usable(snapshot):",
        "if self.disk is not None:",
    ),
    _engine(
        "kvcache_snapshot_over_the_budget_written",
        paths.PROMPT_CACHE_PY,
        (
            '                f"({self.budget / 2**20:.1f} MiB); not saved"\n'
            "            )\n"
            "            return False\n"
        ),
        '                f"({self.budget / 2**20:.1f} MiB); not saved"\n            )\n',
    ),
    _engine(
        "kvcache_turned_off_silently",
        paths.PROMPT_CACHE_PY,
        '            self.warn(f"kv cache: turned off: {exc}")\n',
        "",
    ),
    # snapshot files, the model fingerprint, the state codec
    _engine(
        "fingerprint_ignores_the_file_size",
        paths.SNAPSHOT_FILE_PY,
        "    digest.update(str(size).encode())\n",
        "",
    ),
    _engine(
        "fingerprint_ignores_the_last_mib",
        paths.SNAPSHOT_FILE_PY,
        (
            "        file.seek(max(0, size - _EDGE_BYTES))\n"
            "        digest.update(file.read(_EDGE_BYTES))\n"
        ),
        "",
    ),
    _engine(
        "fingerprint_ignores_the_first_mib",
        paths.SNAPSHOT_FILE_PY,
        "        digest.update(file.read(_EDGE_BYTES))\n        file.seek",
        "        file.seek",
    ),
    _engine(
        "fingerprint_sample_reads_past_a_small_tensor",
        paths.SNAPSHOT_FILE_PY,
        "file.read(min(info.nbytes, _SAMPLE_BYTES))",
        "file.read(_SAMPLE_BYTES)",
    ),
    _engine(
        "fingerprint_ignores_tensor_bytes",
        paths.SNAPSHOT_FILE_PY,
        "            digest.update(file.read(min(info.nbytes, _SAMPLE_BYTES)))\n",
        "",
    ),
    _engine(
        "fingerprint_ignores_tensor_types_and_shapes",
        paths.SNAPSHOT_FILE_PY,
        'f"{info.name} {int(info.qtype)} {info.ggml_dims} {info.nbytes}\\n"',
        'f"{info.name} {info.nbytes}\\n"',
    ),
    _engine(
        "fingerprint_ignores_the_network_sources",
        paths.SNAPSHOT_FILE_PY,
        '            digest.update(module.name.encode() + b"\\0" + module.read_bytes())\n',
        "            pass\n",
    ),
    _engine(
        "fingerprint_reads_source_names_not_contents",
        paths.SNAPSHOT_FILE_PY,
        'module.name.encode() + b"\\0" + module.read_bytes()',
        "module.name.encode()",
    ),
    _engine(
        "fingerprint_ignores_the_network_module",
        paths.SNAPSHOT_FILE_PY,
        'f"{network.__module__}.{network.__qualname__}\\n"',
        'f"{network.__qualname__}\\n"',
    ),
    _engine(
        "snapshot_seven_bytes_read_as_a_header_length",
        paths.SNAPSHOT_FILE_PY,
        "if len(prefix) < 8:",
        "if len(prefix) < 7:",
    ),
    _engine(
        "snapshot_header_filling_the_file_refused",
        paths.SNAPSHOT_FILE_PY,
        "if length > min(size - 8, _MAX_HEADER_BYTES):",
        "if length >= min(size - 8, _MAX_HEADER_BYTES):",
    ),
    _engine(
        "snapshot_header_limit_of_one_kib",
        paths.SNAPSHOT_FILE_PY,
        "_MAX_HEADER_BYTES = 1 << 30",
        "_MAX_HEADER_BYTES = 1 << 10",
    ),
    _engine(
        "snapshot_version_written_as_a_number",
        paths.SNAPSHOT_FILE_PY,
        '"version": str(FORMAT_VERSION),',
        '"version": FORMAT_VERSION,',
    ),
    _engine(
        "snapshot_temporary_name_without_the_suffix",
        paths.SNAPSHOT_FILE_PY,
        'path.with_name(f".{path.name[: -len(SUFFIX)]}.{uuid.uuid4().hex}.tmp{SUFFIX}")',
        'path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")',
    ),
    _engine(
        "snapshot_failed_write_leaves_its_temporary",
        paths.SNAPSHOT_FILE_PY,
        "        temporary.unlink(missing_ok=True)\n        raise\n",
        "        raise\n",
    ),
    _engine(
        "snapshot_checksum_ignores_array_shapes",
        paths.SNAPSHOT_FILE_PY,
        'digest.update(f"{name} {array.dtype} {array.shape}\\n".encode())',
        'digest.update(f"{name}\\n".encode())',
    ),
    _engine(
        "snapshot_unloadable_array_type_escapes",
        paths.SNAPSHOT_FILE_PY,
        (
            "    except (RuntimeError, ValueError, OSError) as exc:\n"
            '        raise SnapshotFileError(f"{path}: cannot be read: {exc}") from exc\n'
            "    assert"
        ),
        (
            "    except (OSError,) as exc:\n"
            '        raise SnapshotFileError(f"{path}: cannot be read: {exc}") from exc\n'
            "    assert"
        ),
    ),
    _engine(
        "state_codec_strings_refused",
        paths.STATE_CODEC_PY,
        "if obj is None or isinstance(obj, (bool, str)):",
        "if obj is None or isinstance(obj, bool):",
    ),
    _engine(
        "state_codec_floats_refused",
        paths.STATE_CODEC_PY,
        "        if isinstance(obj, (int, float)):\n            return obj\n",
        "        if isinstance(obj, int):\n            return obj\n",
    ),
    _engine(
        "state_codec_list_comes_back_a_tuple",
        paths.STATE_CODEC_PY,
        'return {"list": [walk(item) for item in obj]}',
        'return {"tuple": [walk(item) for item in obj]}',
    ),
    _engine(
        "state_codec_arrays_share_one_name",
        paths.STATE_CODEC_PY,
        'name = f"a{len(arrays)}"',
        'name = "a"',
    ),
    _engine(
        "state_codec_numpy_array_comes_back_mlx",
        paths.STATE_CODEC_PY,
        'return np.array(array(node["ndarray"]))',
        'return array(node["ndarray"])',
    ),
    _engine(
        "state_codec_dict_comes_back_a_list",
        paths.STATE_CODEC_PY,
        'return {key: walk(value) for key, value in node["dict"].items()}',
        'return [walk(value) for value in node["dict"].values()]',
    ),
    _engine(
        "state_codec_derived_field_passed_to_the_constructor",
        paths.STATE_CODEC_PY,
        "obj = cls(**{name: values[name] for name, f in fields.items() if f.init})",
        "obj = cls(**{name: values[name] for name, f in fields.items()})",
    ),
    _engine(
        "state_codec_nested_class_not_found",
        paths.STATE_CODEC_PY,
        '        for part in qualname.split("."):\n            cls = getattr(cls, part)\n',
        "        cls = getattr(cls, qualname)\n",
    ),
    _engine(
        "state_codec_fields_left_encoded",
        paths.STATE_CODEC_PY,
        'return _rebuild(node["class"], {k: walk(v) for k, v in node["fields"].items()})',
        'return _rebuild(node["class"], dict(node["fields"]))',
    ),
    _engine(
        "state_codec_class_object_walked_as_an_instance",
        paths.STATE_CODEC_PY,
        "if dataclasses.is_dataclass(obj) and not isinstance(obj, type):",
        "if dataclasses.is_dataclass(obj):",
    ),
    # generation loop, session, detokenizer
    _engine(
        "generate_empty_prompt_reaches_the_model",
        paths.GENERATE_PY,
        '    if not prompt:\n        raise ValueError("the prompt is empty")\n',
        "",
    ),
    _engine(
        "generate_stop_token_ignored",
        paths.GENERATE_PY,
        '    if token in stop_tokens:\n        return "stop"\n',
        "",
    ),
    _engine(
        "generate_run_room_adds_the_generated",
        paths.GENERATE_PY,
        "room = limits.max_tokens - stats.generated_tokens",
        "room = limits.max_tokens + stats.generated_tokens",
    ),
    _engine(
        "generate_run_room_ignores_the_context",
        paths.GENERATE_PY,
        "        if limits.max_context is not None:\n",
        "        if limits.max_context is None:\n",
    ),
    _engine(
        "generate_logprobs_kept_past_a_stop",
        paths.GENERATE_PY,
        "        sampler.keep_logprobs(logprobs, tokens)\n",
        "        sampler.keep_logprobs(logprobs, [int(t) for t in sampled_tokens.tolist()])\n",
    ),
    _engine(
        "generate_logit_bias_ids_unchecked",
        paths.GENERATE_PY,
        "    if sampler.options.logit_bias:\n",
        "    if not sampler.options.logit_bias:\n",
    ),
    _engine(
        "generate_logit_bias_error_unnamed",
        paths.GENERATE_PY,
        'raise ValueError(f"logit_bias: {exc}") from None',
        "raise",
    ),
    _engine(
        "generate_prefill_not_timed",
        paths.GENERATE_PY,
        "    stats.prefill_seconds = time.perf_counter() - start  # sampling",
        "    stats.prefill_seconds = 0.0  # sampling",
    ),
    _engine(
        "generate_decode_not_timed",
        paths.GENERATE_PY,
        "    stats.decode_seconds = time.perf_counter() - start\n",
        "",
    ),
    _engine(
        "generate_alone_yields_decode_steps",
        paths.GENERATE_PY,
        "            if not isinstance(event, DecodeStep):\n                yield event",
        "            yield event",
    ),
    _engine(
        "generate_run_queues_one_step_too_many",
        paths.GENERATE_PY,
        "        if step == steps - 1:\n",
        "        if step == steps:\n",
    ),
    _engine(
        "session_empty_feed_accepted",
        paths.SESSION_PY,
        "        if len(tokens) == 0:\n",
        "        if len(tokens) < 0:\n",
    ),
    _engine(
        "session_vocabulary_range_misnamed",
        paths.SESSION_PY,
        'f"(0..{vocab_size - 1})"',
        'f"(0..{vocab_size})"',
    ),
    _engine(
        "session_float_token_ids_accepted",
        paths.SESSION_PY,
        '            raise ValueError(f"token ids must be integers, got {ids.dtype} values")\n',
        "            pass\n",
    ),
    _engine(
        "session_confirmed_tokens_dropped",
        paths.SESSION_PY,
        "        self.tokens.extend(int(t) for t in tokens)\n\n    def feed_hidden(",
        "        pass\n\n    def feed_hidden(",
    ),
    _engine(
        "session_batch_without_batched_decode",
        paths.SESSION_PY,
        "    if not supports_batched_decode(model):\n",
        "    if False:\n",
    ),
    _engine(
        "detokenizer_tokens_not_listed",
        paths.DETOKENIZER_PY,
        "        self.tokens.append(token_id)\n",
        "",
    ),
    _engine(
        "detokenizer_skip_special_ignored",
        paths.DETOKENIZER_PY,
        "        self._skip_special = skip_special\n",
        "        self._skip_special = False\n",
    ),
    # tokenizer
    _engine(
        "tokenizer_deepseek_v3_splits_unknown",
        paths.TOKENIZER_PY,
        '    "deepseek-v3": _DEEPSEEK3,\n',
        "",
    ),
    _engine(
        "tokenizer_gpt2_splits_misnamed",
        paths.TOKENIZER_PY,
        '    "gpt-2": _GPT2,\n',
        '    "gpt2": _GPT2,\n',
    ),
    _engine(
        "tokenizer_glm4_applies_merges_to_whole_words",
        paths.TOKENIZER_PY,
        '"glm4": PreTokenizerSpec((_CHATGLM4_REGEX,), ignore_merges=True),',
        '"glm4": PreTokenizerSpec((_CHATGLM4_REGEX,)),',
    ),
    _engine(
        "tokenizer_chatglm_bpe_splits_unknown",
        paths.TOKENIZER_PY,
        '    "chatglm-bpe": PreTokenizerSpec((_CHATGLM4_REGEX,)),\n',
        "",
    ),
    _engine(
        "tokenizer_split_pieces_removed",
        paths.TOKENIZER_PY,
        'behavior="isolated"',
        'behavior="removed"',
    ),
    _engine(
        "tokenizer_prefix_space_added",
        paths.TOKENIZER_PY,
        "ByteLevel(add_prefix_space=False, use_regex=False)",
        "ByteLevel(add_prefix_space=True, use_regex=False)",
    ),
    _engine(
        "tokenizer_unknown_pre_error_lists_nothing",
        paths.TOKENIZER_PY,
        'known = ", ".join(sorted(PRE_TOKENIZERS))',
        'known = ""',
    ),
    _engine(
        "tokenizer_byte_alphabet_misses_the_tilde",
        paths.TOKENIZER_PY,
        '*range(ord("!"), ord("~") + 1),',
        '*range(ord("!"), ord("~")),',
    ),
    _engine(
        "tokenizer_unprintable_bytes_share_one_character",
        paths.TOKENIZER_PY,
        "            shifted += 1\n",
        "",
    ),
    _engine(
        "tokenizer_character_outside_the_alphabet_dropped",
        paths.TOKENIZER_PY,
        'out.extend(char.encode("utf-8") if byte is None else (byte,))',
        'out.extend(b"" if byte is None else (byte,))',
    ),
    _engine(
        "tokenizer_any_named_model_read_as_bpe",
        paths.TOKENIZER_PY,
        '        if model != "gpt2":\n',
        "        if model is None:\n",
    ),
    _engine(
        "tokenizer_missing_add_eos_read_as_true",
        paths.TOKENIZER_PY,
        'add_eos=bool(gguf_file.get("tokenizer.ggml.add_eos_token", False)),',
        'add_eos=bool(gguf_file.get("tokenizer.ggml.add_eos_token", True)),',
    ),
    _engine(
        "tokenizer_user_defined_tokens_made_special",
        paths.TOKENIZER_PY,
        "AddedToken(text, special=self._types[token_id] in _SPECIAL_TYPES, normalized=False)",
        "AddedToken(text, special=True, normalized=False)",
    ),
    _engine(
        "tokenizer_control_text_always_parsed",
        paths.TOKENIZER_PY,
        "self._hf.encode_special_tokens = not parse_special",
        "self._hf.encode_special_tokens = False",
    ),
    _engine(
        "tokenizer_added_token_decoded_as_byte_level",
        paths.TOKENIZER_PY,
        '                cached = text.encode("utf-8")\n',
        "                cached = _byte_level_bytes(text)\n",
    ),
    _engine(
        "tokenizer_test_vocabulary_hashes_four_bytes",
        paths.TOKENIZER_PY,
        "_CHUNK_BYTES = 5",
        "_CHUNK_BYTES = 4",
    ),
    _engine(
        "token_id_list_trailing_text_accepted",
        paths.TOKENIZER_PY,
        "    if position != len(text):\n",
        "    if position > len(text):\n",
    ),
    _engine(
        "tokenizer_writer_counts_ids_not_the_largest",
        paths.TOKENIZER_PY,
        "n_tokens = max(id_to_text) + 1",
        "n_tokens = len(id_to_text)",
    ),
    _engine(
        "tokenizer_writer_pads_with_one_name",
        paths.TOKENIZER_PY,
        'tokens.append(f"[PAD{token_id}]")',
        'tokens.append("[PAD]")',
    ),
    _engine(
        "tokenizer_writer_keeps_the_word_boundary_mark",
        paths.TOKENIZER_PY,
        'text = text.replace("\\u2581", " ")',
        "text = text",
    ),
    _engine(
        "tokenizer_writer_drops_the_pad_id",
        paths.TOKENIZER_PY,
        "        (pad_token, writer.add_pad_token_id),\n",
        "",
    ),
    _engine(
        "tokenizer_writer_drops_the_chat_template",
        paths.TOKENIZER_PY,
        "    if chat_template is not None:\n        writer.add_chat_template(chat_template)\n",
        "",
    ),
    _engine(
        "tokenizer_writer_splits_string_merges_again",
        paths.TOKENIZER_PY,
        "    if merges and isinstance(merges[0], str):\n        return list(merges)\n",
        "",
    ),
    _engine(
        "numeric_tokenizer_bytes_without_brackets",
        paths.TOKENIZER_PY,
        'return f"<{token_id}>".encode()',
        'return f"{token_id}".encode()',
    ),
    # sampling and constraints
    _engine(
        "sampling_default_window_of_32_tokens",
        paths.SAMPLING_PY,
        "    repeat_last_n: int = 64\n",
        "    repeat_last_n: int = 32\n",
    ),
    _engine(
        "sampling_repeat_penalty_below_one_ignored",
        paths.SAMPLING_PY,
        "            self.repeat_penalty != 1.0\n",
        "            self.repeat_penalty > 1.0\n",
    ),
    _engine(
        "top_p_counts_a_token_in_the_mass_before_it",
        paths.SAMPLING_PY,
        "before = mx.cumsum(probs, axis=-1) - probs",
        "before = mx.cumsum(probs, axis=-1)",
    ),
    _engine(
        "min_p_threshold_above_the_best_token",
        paths.SAMPLING_PY,
        "logprobs.max(axis=-1, keepdims=True) + log_min_p",
        "logprobs.max(axis=-1, keepdims=True) - log_min_p",
    ),
    _engine(
        "sampling_commit_leaves_the_constraint_behind",
        paths.SAMPLING_PY,
        "        if self.constraint is not None:\n            self.constraint.advance(token)\n",
        "",
    ),
    _engine(
        "grammar_view_without_special_tokens",
        paths.CONSTRAINTS_PY,
        "self.special_token_ids = [token for token in range(size) if is_special(token)]",
        "self.special_token_ids = []",
    ),
)
