"""Mutations the engine's tests were hardened against (issue 37, session 17): plausible one-line
bugs in ``ds4mlx/engine`` (boundaries, members of literal sets, defaults, ``and``/``or``, early
returns, fields of what is returned, one branch of an ``if``), each applied by hand, run against
the test file meant to catch it, and given a test where none failed. They were picked where the
engine folder's coverage run and the earlier sets left code unchecked: the generation loop's
limits and batched steps, ``feed_batch`` and hidden feeds, snapshot headers and the state codec,
the disk tier's unknown and changed entries,
the tokenizer's refusals and token types, the chat formats' shared rules and the call grammar's
view of the tools, GLM's content parts and DeepSeek's string-only content, the sampler's seed
and padding, and grammar errors and rollbacks.

Measured on the code before these tests, each against its area's older test files (a narrower
run than the whole folder): 87 of the 114 survived, 27 were caught. Now all 114 are caught.

None changes a line an earlier set (core, guards, fresh2 to fresh7) changes. Left out as
equivalent: ``logprob_arrays`` testing ``top is None`` instead of ``not top`` (a top of 0 slices
no alternatives either way) and ``keep_logprobs`` wanting three arrays for alternatives (it gets
one or three). Left out as not a clean catch: ``stepped_generate`` skipping its ``logit_bias``
check (MLX aborts the process on the out-of-range index: the run reports a crash, not a
failure).
"""

from __future__ import annotations

from mutation_sets.base import (
    CALL_GRAMMAR_PY,
    CHAT_BASE_PY,
    CONSTRAINTS_PY,
    DEEPSEEK4_CHAT_PY,
    GENERATE_PY,
    GLM5_CHAT_PY,
    PROMPT_CACHE_PY,
    PROMPT_PY,
    SAMPLING_PY,
    SESSION_PY,
    SNAPSHOT_FILE_PY,
    STATE_CODEC_PY,
    TOKENIZER_PY,
)
from mutation_sets.base import in_engine_folder as _engine

MUTATIONS = (
    _engine(
        "prefill_rate_guarded_by_tokens",
        GENERATE_PY,
        "self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0",
        "self.prompt_tokens / self.prefill_seconds if self.prompt_tokens else 0.0",
    ),
    _engine(
        "context_stop_one_late",
        GENERATE_PY,
        "if max_context is not None and session_tokens >= max_context:",
        "if max_context is not None and session_tokens > max_context:",
    ),
    _engine(
        "pipeline_room_ignores_context",
        GENERATE_PY,
        "room = min(room, limits.max_context - session.n_tokens)",
        "room = min(room, limits.max_context - session.n_tokens + 1)",
    ),
    _engine(
        "pipeline_steps_ignore_room",
        GENERATE_PY,
        "steps = min(self.pipeline, room)",
        "steps = self.pipeline",
    ),
    _engine(
        "pipeline_for_host_only_sessions",
        GENERATE_PY,
        "if steps <= 1 or not session.lazy_feeds or not",
        "if steps <= 1 or not",
    ),
    _engine(
        "confirm_includes_last_sampled",
        GENERATE_PY,
        "session.confirm([token, *tokens[:-1]])",
        "session.confirm([token, *tokens])",
    ),
    _engine(
        "pending_popped_from_end",
        GENERATE_PY,
        "token = pending.pop(0)",
        "token = pending.pop()",
    ),
    _engine(
        "generated_not_counted",
        GENERATE_PY,
        "stats.generated_tokens += 1",
        "stats.generated_tokens += 2",
    ),
    _engine(
        "batched_logits_ignored",
        GENERATE_PY,
        "pending = [sampler(logits)]",
        "pending = decoder.advance(session, token, sampler, stats, limits)",
    ),
    _engine(
        "pending_steps_announced",
        GENERATE_PY,
        "        if pending:\n            continue\n",
        "",
    ),
    _engine(
        "batch_tokens_not_kept",
        SESSION_PY,
        "session.tokens.append(int(token))",
        "pass",
    ),
    _engine(
        "batch_of_mixed_models",
        SESSION_PY,
        "if any(session.model is not model for session in sessions):",
        "if all(session.model is not model for session in sessions):",
    ),
    _engine(
        "batch_count_unchecked",
        SESSION_PY,
        "if len(tokens) != len(sessions):",
        "if len(tokens) > len(sessions):",
    ),
    _engine(
        "batch_empty_accepted",
        SESSION_PY,
        "    if not sessions:\n        raise",
        "    if sessions is None:\n        raise",
    ),
    _engine(
        "hidden_feed_tokens_not_kept",
        SESSION_PY,
        (
            "            all_logits=all_logits,\n"
            "        )\n"
            "        self.tokens.extend(int(t) for t in tokens)"
        ),
        "            all_logits=all_logits,\n        )",
    ),
    _engine(
        "snapshot_counts_one_less",
        SESSION_PY,
        "return len(self.tokens)\n\n\nclass Session",
        "return len(self.tokens) - 1\n\n\nclass Session",
    ),
    _engine(
        "batched_decode_by_name_only",
        SESSION_PY,
        'return callable(getattr(model, "forward_batch", None))',
        'return hasattr(model, "forward")',
    ),
    _engine(
        "codec_numpy_bools_unsaved",
        STATE_CODEC_PY,
        "(np.integer, np.floating, np.bool_)",
        "(np.integer, np.floating)",
    ),
    _engine(
        "codec_strings_refused_on_load",
        STATE_CODEC_PY,
        "isinstance(node, (bool, int, float, str))",
        "isinstance(node, (bool, int, float))",
    ),
    _engine(
        "codec_array_name_unchecked",
        STATE_CODEC_PY,
        "if not isinstance(name, str) or name not in arrays:",
        "if not isinstance(name, str):",
    ),
    _engine(
        "codec_three_key_nodes_walked",
        STATE_CODEC_PY,
        "len(node) not in (1, 2)",
        "len(node) not in (1, 2, 3)",
    ),
    _engine(
        "codec_empty_class_name_imported",
        STATE_CODEC_PY,
        "if not module_name.startswith(_TRUSTED_PREFIX) or not qualname:",
        "if not module_name.startswith(_TRUSTED_PREFIX):",
    ),
    _engine(
        "codec_missing_module_escapes",
        STATE_CODEC_PY,
        "except (ImportError, AttributeError):",
        "except AttributeError:",
    ),
    _engine(
        "codec_functions_rebuilt",
        STATE_CODEC_PY,
        "if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):",
        "if not dataclasses.is_dataclass(cls):",
    ),
    _engine(
        "codec_derived_fields_recomputed",
        STATE_CODEC_PY,
        "        if not f.init:  # a field",
        "        if f.init and not f.init:  # a field",
    ),
    _engine(
        "codec_numpy_scalar_as_python",
        STATE_CODEC_PY,
        'return np.dtype(node["numpy_scalar"]).type(node["value"])',
        'return node["value"]',
    ),
    _engine(
        "snapshot_suffix_unchecked",
        SNAPSHOT_FILE_PY,
        "    if not path.name.endswith(SUFFIX):\n        raise ValueError",
        "    if not path.name:\n        raise ValueError",
    ),
    _engine(
        "snapshot_header_list_accepted",
        SNAPSHOT_FILE_PY,
        "    if not isinstance(header, dict):\n        raise SnapshotFileError",
        "    if header is None:\n        raise SnapshotFileError",
    ),
    _engine(
        "snapshot_format_unchecked",
        SNAPSHOT_FILE_PY,
        'if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:',
        "if not isinstance(metadata, dict):",
    ),
    _engine(
        "snapshot_offsets_type_escapes",
        SNAPSHOT_FILE_PY,
        (
            "except (TypeError, KeyError, IndexError, ValueError) as exc:\n"
            '        raise SnapshotFileError(f"{path}: malformed header'
        ),
        (
            "except (KeyError, IndexError, ValueError) as exc:\n"
            '        raise SnapshotFileError(f"{path}: malformed header'
        ),
    ),
    _engine(
        "snapshot_arrayless_end_default",
        SNAPSHOT_FILE_PY,
        "for entry in header.values()), default=0)",
        "for entry in header.values()), default=8)",
    ),
    _engine(
        "snapshot_tokens_key_escapes",
        SNAPSHOT_FILE_PY,
        (
            "except (KeyError, json.JSONDecodeError) as exc:\n"
            '        raise SnapshotFileError(f"{path}: malformed token list'
        ),
        (
            "except json.JSONDecodeError as exc:\n"
            '        raise SnapshotFileError(f"{path}: malformed token list'
        ),
    ),
    _engine(
        "snapshot_state_error_escapes",
        SNAPSHOT_FILE_PY,
        (
            "except (StateFormatError, KeyError, TypeError, ValueError) as exc:\n"
            '        raise SnapshotFileError(f"{path}: {exc}")'
        ),
        'except (KeyError, TypeError) as exc:\n        raise SnapshotFileError(f"{path}: {exc}")',
    ),
    _engine(
        "snapshot_nbytes_counts_arrays_once",
        SNAPSHOT_FILE_PY,
        "return sum(array.nbytes for array in arrays.values())",
        "return sum(array.size for array in arrays.values())",
    ),
    _engine(
        "tok_unknown_not_atomic",
        TOKENIZER_PY,
        "_ATOMIC_TYPES = frozenset({TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN})",
        "_ATOMIC_TYPES = frozenset({TokenType.CONTROL, TokenType.USER_DEFINED})",
    ),
    _engine(
        "tok_unknown_not_special",
        TOKENIZER_PY,
        "_SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN})",
        "_SPECIAL_TYPES = frozenset({TokenType.CONTROL})",
    ),
    _engine(
        "tok_joyai_name_missing",
        TOKENIZER_PY,
        '    "joyai-llm": _DEEPSEEK3,\n',
        "",
    ),
    _engine(
        "tok_glm5_merges_not_ignored",
        TOKENIZER_PY,
        '"glm5": PreTokenizerSpec((_CHATGLM4_REGEX,), ignore_merges=True)',
        '"glm5": PreTokenizerSpec((_CHATGLM4_REGEX,))',
    ),
    _engine(
        "tok_short_type_list_accepted",
        TOKENIZER_PY,
        "if token_types is not None and len(token_types) < len(tokens):",
        "if token_types is not None and len(token_types) < len(tokens) - 1:",
    ),
    _engine(
        "tok_duplicates_accepted",
        TOKENIZER_PY,
        "if len(self._token_to_id) != len(self._tokens):",
        "if len(self._token_to_id) > len(self._tokens):",
    ),
    _engine(
        "tok_special_id_at_vocab_size",
        TOKENIZER_PY,
        "if token_id is not None and not 0 <= token_id < len(self._tokens):",
        "if token_id is not None and not 0 <= token_id <= len(self._tokens):",
    ),
    _engine(
        "tok_pad_id_unchecked",
        TOKENIZER_PY,
        '            ("pad", pad_id),\n',
        "",
    ),
    _engine(
        "tok_pre_default_other",
        TOKENIZER_PY,
        'gguf_file.get("tokenizer.ggml.pre") or "default"',
        'gguf_file.get("tokenizer.ggml.pre") or "gpt-2"',
    ),
    _engine(
        "tok_eom_not_a_stop",
        TOKENIZER_PY,
        'for key in ("eot_token_id", "eom_token_id")',
        'for key in ("eot_token_id",)',
    ),
    _engine(
        "tok_tokens_missing_accepted",
        TOKENIZER_PY,
        "if not tokens or merges is None:",
        "if tokens is None or merges is None:",
    ),
    _engine(
        "tok_merge_without_space_accepted",
        TOKENIZER_PY,
        "            if not space:\n                raise TokenizerError",
        "            if not left:\n                raise TokenizerError",
    ),
    _engine(
        "tok_eos_added_without_asking",
        TOKENIZER_PY,
        "if add_special and self.add_eos and self.eos_id is not None:",
        "if add_special and self.eos_id is not None:",
    ),
    _engine(
        "tok_unused_bytes_kept",
        TOKENIZER_PY,
        '            elif token_type == TokenType.UNUSED:\n                cached = b""',
        '            elif token_type == TokenType.UNUSED and False:\n                cached = b""',
    ),
    _engine(
        "tok_id_to_token_unchecked",
        TOKENIZER_PY,
        "        self._type_of(token_id)\n        return self._tokens[token_id]",
        "        return self._tokens[token_id]",
    ),
    _engine(
        "numeric_chunk_hash_base",
        TOKENIZER_PY,
        "chunk_hash = chunk_hash * 31 + byte",
        "chunk_hash = chunk_hash * 37 + byte",
    ),
    _engine(
        "numeric_token_to_id_prefix",
        TOKENIZER_PY,
        'match = re.fullmatch(r"<(\\d+)>", text)',
        'match = re.match(r"<(\\d+)>", text)',
    ),
    _engine(
        "numeric_vocab_from_empty_tokens",
        TOKENIZER_PY,
        "return NumericTokenizer(len(tokens) if tokens else None)",
        "return NumericTokenizer(len(tokens) if tokens else 0)",
    ),
    _engine(
        "writer_looks_special_mask_missing",
        TOKENIZER_PY,
        '_LOOKS_SPECIAL = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")',
        '_LOOKS_SPECIAL = ("<pad>", "<2mass>", "[@BOS@]")',
    ),
    _engine(
        "writer_looks_special_prefix_only",
        TOKENIZER_PY,
        'or (text.startswith("<|") and text.endswith("|>"))',
        'or text.startswith("<|")',
    ),
    _engine(
        "writer_unused_prefix_only",
        TOKENIZER_PY,
        'or (text.startswith("<unused") and text.endswith(">"))',
        'or text.startswith("<unused")',
    ),
    _engine(
        "writer_vocab_size_equal_refused",
        TOKENIZER_PY,
        "if vocab_size < n_tokens:",
        "if vocab_size <= n_tokens:",
    ),
    _engine(
        "writer_add_bos_false_dropped",
        TOKENIZER_PY,
        "    if add_bos is not None:\n        writer.add_add_bos_token",
        "    if add_bos:\n        writer.add_add_bos_token",
    ),
    _engine(
        "writer_unknown_token_name_ignored",
        TOKENIZER_PY,
        "            if token_id is None:\n                raise TokenizerError",
        "            if token_id is None and False:\n                raise TokenizerError",
    ),
    _engine(
        "writer_merge_space_kept",
        TOKENIZER_PY,
        'return [" ".join(part.replace(" ", "\\u0120") for part in pair) for pair in merges]',
        'return [" ".join(pair) for pair in merges]',
    ),
    _engine(
        "writer_non_bpe_accepted",
        TOKENIZER_PY,
        'if model_json.get("type") != "BPE":',
        'if model_json.get("type") is None:',
    ),
    _engine(
        "chat_effort_names_unchecked",
        CHAT_BASE_PY,
        "        if effort not in REASONING_EFFORT_ORDER:\n            raise",
        "        if not effort:\n            raise",
    ),
    _engine(
        "chat_max_without_a_maximum_accepted",
        CHAT_BASE_PY,
        'if effort == "max" and "max" not in self.reasoning_efforts:',
        'if effort == "max" and not self.reasoning_efforts:',
    ),
    _engine(
        "chat_no_efforts_gives_the_request",
        CHAT_BASE_PY,
        "        if not self.reasoning_efforts:\n            return None",
        "        if not self.reasoning_efforts:\n            return effort",
    ),
    _engine(
        "chat_flat_tool_call_entry_refused",
        CHAT_BASE_PY,
        'function = entry.get("function", entry)',
        'function = entry["function"]',
    ),
    _engine(
        "chat_unparseable_arguments_dropped",
        CHAT_BASE_PY,
        '        except json.JSONDecodeError:\n            arguments = {"arguments": arguments}',
        "        except json.JSONDecodeError:\n            arguments = {}",
    ),
    _engine(
        "chat_forced_name_first_occurrence",
        CHAT_BASE_PY,
        "head, name, tail = prefix.rpartition(tool_choice.name)",
        "head, name, tail = prefix.partition(tool_choice.name)",
    ),
    _engine(
        "chat_tool_start_announced_twice",
        CHAT_BASE_PY,
        "        if not self.announced:\n            events.append(ToolCallStart(name))",
        "        if True:\n            events.append(ToolCallStart(name))",
    ),
    _engine(
        "chat_first_argument_separator",
        CHAT_BASE_PY,
        'separator = ", " if self.sent else "{"',
        'separator = ", " if self.announced else "{"',
    ),
    _engine(
        "marker_later_one_wins",
        CHAT_BASE_PY,
        "or position < best[0]",
        "or position > best[0]",
    ),
    _engine(
        "marker_shorter_one_wins_a_tie",
        CHAT_BASE_PY,
        "or (position == best[0] and len(marker) > len(best[1]))",
        "or (position == best[0] and len(marker) < len(best[1]))",
    ),
    _engine(
        "marker_prefix_whole_marker_held",
        CHAT_BASE_PY,
        "max(len(m) for m in markers) - 1), 0, -1)",
        "max(len(m) for m in markers) - 2), 0, -1)",
    ),
    _engine(
        "marker_prefix_first_char_never_held",
        CHAT_BASE_PY,
        "max(len(m) for m in markers) - 1), 0, -1)",
        "max(len(m) for m in markers) - 1), 1, -1)",
    ),
    _engine(
        "prompt_empty_template_pieces_kept",
        PROMPT_PY,
        "self.pieces.extend((text, True) for text in texts if text)",
        "self.pieces.extend((text, True) for text in texts)",
    ),
    _engine(
        "prompt_empty_caller_pieces_kept",
        PROMPT_PY,
        "self.pieces.extend((text, False) for text in texts if text)",
        "self.pieces.extend((text, False) for text in texts)",
    ),
    _engine(
        "prompt_special_spellings_shortest_first",
        PROMPT_PY,
        "sorted(spellings, key=len, reverse=True)",
        "sorted(spellings, key=len)",
    ),
    _engine(
        "prompt_numeric_tokens_split_at_pieces",
        PROMPT_PY,
        (
            "        if not from_template or pattern is None:\n"
            "            plain.append(text)\n"
            "            continue"
        ),
        (
            "        if not from_template:\n"
            "            plain.append(text)\n"
            "            continue\n"
            "        if pattern is None:\n"
            "            yield text, False\n"
            "            continue"
        ),
    ),
    _engine(
        "prompt_max_token_bytes_numeric_unknown",
        PROMPT_PY,
        "        return NumericTokenizer._CHUNK_BYTES  # one id",
        "        return None  # one id",
    ),
    _engine(
        "grammar_layout_dropped_for_any_value",
        CALL_GRAMMAR_PY,
        '    options = dict(schema or {})\n    options["x-guidance"] = JSON_LAYOUT',
        (
            "    options = dict(schema or {})\n"
            "    if schema:\n"
            '        options["x-guidance"] = JSON_LAYOUT'
        ),
    ),
    _engine(
        "grammar_flat_tool_unnamed",
        CALL_GRAMMAR_PY,
        'return tool.get("function", tool)',
        'return tool.get("function", {})',
    ),
    _engine(
        "grammar_strict_ignored",
        CALL_GRAMMAR_PY,
        'return bool(function_of(tool).get("strict"))',
        'return function_of(tool).get("strict") == "true"',
    ),
    _engine(
        "grammar_enum_string_is_plain",
        CALL_GRAMMAR_PY,
        'return self.schema.get("type") == "string" and not any(',
        'return self.schema.get("type") == "string" or not any(',
    ),
    _engine(
        "grammar_nothing_required",
        CALL_GRAMMAR_PY,
        'required = set(schema.get("required") or ())',
        "required = set()",
    ),
    _engine(
        "grammar_bad_subschema_kept",
        CALL_GRAMMAR_PY,
        "Parameter(str(name), sub if isinstance(sub, Mapping) else {}, name in required)",
        "Parameter(str(name), sub, name in required)",
    ),
    _engine(
        "grammar_all_parameters_optional",
        CALL_GRAMMAR_PY,
        'return " ".join(rule if required else f"{rule}?" for rule, required in items) or \'""\'',
        'return " ".join(f"{rule}?" for rule, required in items) or \'""\'',
    ),
    _engine(
        "grammar_auto_choice_forces",
        CALL_GRAMMAR_PY,
        'return tools, tool_choice == "required"',
        'return tools, tool_choice != "none"',
    ),
    _engine(
        "sampler_seed_zero_unseeded",
        SAMPLING_PY,
        "if options.seed is not None:",
        "if options.seed:",
    ),
    _engine(
        "sampler_logprobs_zero_not_noted",
        SAMPLING_PY,
        "        if self.options.logprobs is None:\n            return\n        arrays",
        "        if not self.options.logprobs:\n            return\n        arrays",
    ),
    _engine(
        "sampler_bias_alone_skipped_in_rows",
        SAMPLING_PY,
        "        if not (o.logit_bias or o.penalizes):\n            return rows\n",
        "        if not o.penalizes:\n            return rows\n",
    ),
    _engine(
        "sampler_bias_alone_skipped_on_device",
        SAMPLING_PY,
        "        if not (o.logit_bias or o.penalizes):\n            return row\n",
        "        if not o.penalizes:\n            return row\n",
    ),
    _engine(
        "sampler_negative_temperature_accepted",
        SAMPLING_PY,
        "if self.temperature < 0:",
        "if self.temperature < -1:",
    ),
    _engine(
        "sampler_negative_top_k_accepted",
        SAMPLING_PY,
        "if self.top_k < 0:",
        "if self.top_k < -1:",
    ),
    _engine(
        "sampler_greedy_probabilities_at_first",
        SAMPLING_PY,
        "best = mx.argmax(logits, axis=-1, keepdims=True)",
        "best = mx.argmin(logits, axis=-1, keepdims=True)",
    ),
    _engine(
        "sampler_call_unpenalized",
        SAMPLING_PY,
        "row = self.penalized(logits[None])[0]",
        "row = logits",
    ),
    _engine(
        "sampler_logprob_of_raw_logits",
        SAMPLING_PY,
        "logprobs = rows - mx.logsumexp(rows, axis=-1, keepdims=True)",
        "logprobs = rows",
    ),
    _engine(
        "sampler_recent_tokens_empty",
        SAMPLING_PY,
        "return mx.array(list(self._recent), dtype=mx.int32)",
        "return mx.array(list(self._recent)[1:], dtype=mx.int32)",
    ),
    _engine(
        "sampler_counts_once_per_token",
        SAMPLING_PY,
        "counts = mx.zeros(row.shape, mx.float32).at[window].add(1.0)",
        "counts = mx.zeros(row.shape, mx.float32).at[window].maximum(1.0)",
    ),
    _engine(
        "sampler_masked_row_ignores_constraint",
        SAMPLING_PY,
        "        return row if mask is None else _masked(row, mask)",
        "        return row",
    ),
    _engine(
        "sampler_penalized_rows_unmasked",
        SAMPLING_PY,
        "        return rows if masks is None else _masked(rows, masks)",
        "        return rows",
    ),
    _engine(
        "grammar_vocabulary_without_size_built",
        CONSTRAINTS_PY,
        "        if size is None:\n            raise GrammarError",
        "        if size == 0:\n            raise GrammarError",
    ),
    _engine(
        "grammar_json_check_ignores_failures",
        CONSTRAINTS_PY,
        "    if failed:\n        raise GrammarError(messages[0]",
        "    if failed and not messages:\n        raise GrammarError(messages[0]",
    ),
    _engine(
        "grammar_compile_error_unchecked",
        CONSTRAINTS_PY,
        (
            "        if self._matcher.is_error():\n"
            '            raise GrammarError(f"the grammar does not compile'
        ),
        '        if False:\n            raise GrammarError(f"the grammar does not compile',
    ),
    _engine(
        "grammar_refused_token_consumed",
        CONSTRAINTS_PY,
        "if taken and not self._matcher.consume_token(token):",
        "if not taken and not self._matcher.consume_token(token):",
    ),
    _engine(
        "grammar_json_reasoning_ignored",
        CONSTRAINTS_PY,
        "self.grammar = Grammar(tokenizer, _json_lark(schema, reasoning_end))",
        "self.grammar = Grammar(tokenizer, _json_lark(schema))",
    ),
    _engine(
        "masks_along_unmasked_rows_forbid_all",
        CONSTRAINTS_PY,
        "full = mx.ones((self.vocab_size,), dtype=mx.bool_)",
        "full = mx.zeros((self.vocab_size,), dtype=mx.bool_)",
    ),
    _engine(
        "masks_along_never_none",
        CONSTRAINTS_PY,
        "        if all(mask is None for mask in masks):\n            return None",
        "        if not masks:\n            return None",
    ),
    _engine(
        "constraint_static_by_default",
        CONSTRAINTS_PY,
        "    def static(self) -> bool:\n        return False",
        "    def static(self) -> bool:\n        return True",
    ),
    _engine(
        "glm_none_content_rendered_as_none",
        GLM5_CHAT_PY,
        (
            "    if content is None:\n"
            '        return ""\n'
            "    if isinstance(content, str):\n"
            "        return content\n"
            "    if isinstance(content, Sequence):"
        ),
        (
            "    if isinstance(content, str):\n"
            "        return content\n"
            "    if isinstance(content, Sequence):"
        ),
    ),
    _engine(
        "glm_string_parts_dropped",
        GLM5_CHAT_PY,
        "            if isinstance(item, str):\n                out.append(item)",
        "            if isinstance(item, str):\n                pass",
    ),
    _engine(
        "glm_unknown_part_type_named",
        GLM5_CHAT_PY,
        'out.append(_MEDIA.get(item.get("type"), ""))',
        'out.append(_MEDIA.get(item.get("type"), str(item.get("type"))))',
    ),
    _engine(
        "glm_other_content_dropped",
        GLM5_CHAT_PY,
        '        return "".join(out)\n    return str(content)',
        '        return "".join(out)\n    return ""',
    ),
    _engine(
        "glm_text_part_without_text_fails",
        GLM5_CHAT_PY,
        'out.append(item.get("text", ""))',
        'out.append(item["text"])',
    ),
    _engine(
        "deepseek_non_string_content_joined",
        DEEPSEEK4_CHAT_PY,
        "    if not isinstance(value, str):\n        raise TypeError",
        "    if not isinstance(value, (str, list)):\n        raise TypeError",
    ),
    _engine(
        "disk_changed_tokens_loaded",
        PROMPT_CACHE_PY,
        "        if snapshot.tokens != tokens:\n            del self._index[tokens]",
        "        if snapshot.tokens != tokens and False:\n            del self._index[tokens]",
    ),
    _engine(
        "disk_unindexed_tokens_read",
        PROMPT_CACHE_PY,
        (
            "        path = self._index.get(tokens)\n"
            "        if path is None:\n"
            "            return None\n"
        ),
        "        path = self._index.get(tokens)\n",
    ),
)
