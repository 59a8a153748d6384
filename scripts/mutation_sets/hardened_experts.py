"""Hardened expert stores (issue 37, session 17): hand-made one-line mutations of
``ds4mlx/experts`` of the kinds the last blind pass's survivors were (boundaries, defaults, a
field of the stats, a member of the hot-list document, a check dropped from an ``if``), in the
lines that no earlier set changes, chosen where the folder's tests ran the code without
asserting what it gives (or did not run it: reader, registration, sizing and hot-list edges).
Each is caught by ``tests/experts/test_expert_options.py``, ``test_resident_store.py``,
``test_streamed_setup.py`` or the additions to ``test_reader.py`` and ``test_policy.py``
(checked with the change applied, and the tests passing without it).

Test selection as in the fresh sets: the whole ``tests/experts`` folder, with ``-x``.
"""

from __future__ import annotations

from mutation_sets.base import (
    EXPERT_OPTIONS_PY,
    EXPERT_READER_PY,
    POLICY_PY,
    RESIDENT_PY,
    STORE_PY,
    STREAMED_PY,
)
from mutation_sets.base import in_experts_folder as _experts

MUTATIONS = (
    _experts(
        "expert_options_one_read_thread_refused",
        EXPERT_OPTIONS_PY,
        "if self.read_threads < 1:",
        "if self.read_threads <= 1:",
    ),
    _experts(
        "expert_options_prefetch_off_by_default",
        EXPERT_OPTIONS_PY,
        "prefetch: bool = True",
        "prefetch: bool = False",
    ),
    _experts(
        "expert_cache_budget_g_suffix_kept",
        EXPERT_OPTIONS_PY,
        '.removesuffix("gib").removesuffix("g"))',
        '.removesuffix("gib"))',
    ),
    _experts(
        "expert_auto_budget_share_changed",
        EXPERT_OPTIONS_PY,
        "AUTO_SHARE = 0.8",
        "AUTO_SHARE = 0.9",
    ),
    _experts(
        "expert_auto_budget_all_free_memory",
        STREAMED_PY,
        "budget = min(budget, AUTO_SHARE * available)",
        "budget = min(budget, available)",
    ),
    _experts(
        "expert_fixed_budget_in_gb",
        STREAMED_PY,
        "return int(self.options.cache_gib * 2**30)",
        "return int(self.options.cache_gib * 1e9)",
    ),
    _experts(
        "policy_clock_set_not_advanced", POLICY_PY, "self.clock += steps", "self.clock = steps"
    ),
    _experts(
        "policy_empty_slot_ties_with_a_cold_expert",
        POLICY_PY,
        "hot = np.where(empty, -1.0,",
        "hot = np.where(empty, 0.0,",
    ),
    _experts(
        "policy_victims_as_candidate_positions",
        POLICY_PY,
        "return slots[order[:n]]",
        "return order[:n]",
    ),
    _experts(
        "policy_assign_returns_the_new_key",
        POLICY_PY,
        "        return old\n",
        "        return key\n",
    ),
    _experts(
        "resident_routed_bytes_zero", RESIDENT_PY, "routed_bytes=self._bytes,", "routed_bytes=0,"
    ),
    _experts(
        "resident_capacity_bytes_zero",
        RESIDENT_PY,
        "capacity_bytes=self._bytes,",
        "capacity_bytes=0,",
    ),
    _experts("weight_nbytes_packed_zero", STORE_PY, "return w.data.nbytes", "return 0"),
    _experts(
        "stats_dict_without_read_speed",
        STORE_PY,
        '{"hit_rate": self.hit_rate, "read_gbps": self.read_gbps}',
        '{"hit_rate": self.hit_rate}',
    ),
    _experts(
        "reader_two_dim_expert_trailing",
        EXPERT_READER_PY,
        "shape = (1, *shape)",
        "shape = (*shape, 1)",
    ),
    _experts(
        "reader_zero_sized_stack_accepted",
        EXPERT_READER_PY,
        "if len(shape) != 3 or min(shape) <= 0:",
        "if len(shape) != 3 or min(shape) < 0:",
    ),
    _experts(
        "reader_close_twice_closes_again",
        EXPERT_READER_PY,
        "if self._fd >= 0:",
        "if self._fd >= -1:",
    ),
    _experts(
        "reader_fadvise_missing_says_yes",
        EXPERT_READER_PY,
        'if not hasattr(os, "posix_fadvise"):\n            return False',
        'if not hasattr(os, "posix_fadvise"):\n            return True',
    ),
    _experts(
        "reader_read_seconds_not_summed",
        EXPERT_READER_PY,
        "self.read_seconds += elapsed",
        "self.read_seconds = elapsed",
    ),
    _experts(
        "reader_negative_offset_read",
        EXPERT_READER_PY,
        "if offset < 0 or end > self.file_size:",
        "if end > self.file_size:",
    ),
    _experts(
        "streamed_registration_after_start",
        STREAMED_PY,
        "if self.started:\n            raise RuntimeError",
        "if self.started and not self.layers:\n            raise RuntimeError",
    ),
    _experts(
        "streamed_one_missing_tensor_unreported", STREAMED_PY, "if missing:", "if len(missing) > 1:"
    ),
    _experts(
        "streamed_disagreeing_expert_counts_accepted",
        STREAMED_PY,
        "if len({t.n_experts for t in tensors}) != 1:",
        "if len({t.n_experts for t in tensors}) > 2:",
    ),
    _experts(
        "streamed_layer_prefix_keeps_the_tensor_kind",
        STREAMED_PY,
        'prefix = names[0].rsplit(".", 2)[0]',
        'prefix = names[0].rsplit(".", 1)[0]',
    ),
    _experts(
        "streamed_keys_overlap_between_layers",
        STREAMED_PY,
        "self.n_keys += layer.n_experts",
        "self.n_keys = layer.n_experts",
    ),
    _experts(
        "streamed_no_layers_sized_anyway",
        STREAMED_PY,
        "if not self.layers:\n            return\n",
        "if not self.layers:\n            pass\n",
    ),
    _experts(
        "streamed_half_life_of_one_layer",
        STREAMED_PY,
        "half_life = HALF_LIFE_STEPS * len(self.layers)",
        "half_life = HALF_LIFE_STEPS",
    ),
    _experts(
        "streamed_prefetch_option_ignored",
        STREAMED_PY,
        "if self.options.prefetch:",
        "if self.options.read_threads:",
    ),
    _experts("streamed_staging_max_not_min", STREAMED_PY, "staging = min(\n", "staging = max(\n"),
    _experts(
        "streamed_capacity_without_staging",
        STREAMED_PY,
        "(p.capacity + p.staging + p.reserved) * p.slab.slot_bytes",
        "(p.capacity + p.reserved) * p.slab.slot_bytes",
    ),
    _experts(
        "streamed_resident_bytes_skip_key_zero",
        STREAMED_PY,
        "int((p.policy.slot_key >= 0).sum())",
        "int((p.policy.slot_key > 0).sum())",
    ),
    _experts("streamed_hotlist_version_two", STREAMED_PY, '"version": 1,', '"version": 2,'),
    _experts(
        "streamed_hotlist_model_full_path",
        STREAMED_PY,
        '"model": self.gguf.path.name,',
        '"model": str(self.gguf.path),',
    ),
    _experts(
        "streamed_hotlist_hotness_rounded_coarsely",
        STREAMED_PY,
        '"hotness": round(hot, 6)',
        '"hotness": round(hot, 2)',
    ),
    _experts(
        "streamed_hotlist_experts_dict_accepted",
        STREAMED_PY,
        "if not isinstance(entries, list):",
        "if not isinstance(entries, (list, dict)):",
    ),
    _experts(
        "streamed_hotlist_float_expert_accepted",
        STREAMED_PY,
        "not isinstance(expert, int)\n",
        "not isinstance(expert, (int, float))\n",
    ),
    _experts(
        "streamed_empty_pool_hotlist_not_skipped",
        STREAMED_PY,
        "if not mine:\n                continue",
        "if not mine:\n                pass",
    ),
    _experts(
        "streamed_warm_loaded_not_summed",
        STREAMED_PY,
        "self._stats.warm_loaded += read",
        "self._stats.warm_loaded = read",
    ),
    _experts(
        "streamed_staged_counts_finished_reads",
        STREAMED_PY,
        "[f for f in self.draining if not f.done()]",
        "[f for f in self.draining if f.done()]",
    ),
    _experts(
        "streamed_twin_batch_bytes_as_halves",
        STREAMED_PY,
        "decoded = sum(4 * math.prod",
        "decoded = sum(2 * math.prod",
    ),
    _experts(
        "streamed_twin_batch_of_zero",
        STREAMED_PY,
        "return max(1, TWIN_BATCH_BYTES // decoded)",
        "return max(0, TWIN_BATCH_BYTES // decoded)",
    ),
    _experts(
        "streamed_dense_experts_batched",
        STREAMED_PY,
        'if not any(h.kind == "packed" for h in template):',
        'if all(h.kind == "packed" for h in template):',
    ),
)
