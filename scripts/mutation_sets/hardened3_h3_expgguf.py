"""Hardened experts and GGUF quantization, third pass (issue 37, session 19): hand-made one-line
mutations of the lines no earlier set mutated in ``ds4mlx/experts/`` and ``ds4mlx/gguf/``.

Test selection as in the fresh sets: the whole test folder of the mutated package, with ``-x``.
"""

from __future__ import annotations

from mutation_sets.base import STORE_PY, STREAMED_PY
from mutation_sets.base import in_experts_folder as _experts

MUTATIONS = (
    # the streamed store: a read in flight
    _experts(
        "streamed_read_cancelled_when_one_part_is",
        STREAMED_PY,
        "return all([part.cancel() for part in self.parts])",
        "return any([part.cancel() for part in self.parts])",
    ),
    _experts(
        "streamed_read_done_when_one_part_is",
        STREAMED_PY,
        "return all(part.done() for part in self.parts)",
        "return any(part.done() for part in self.parts)",
    ),
    _experts(
        "streamed_newest_result_not_kept",
        STREAMED_PY,
        "self.store.newest_result = result",
        "self.store.newest_result = None",
    ),
    # sizing
    _experts(
        "streamed_minimum_of_the_smallest_top_k",
        STREAMED_PY,
        "minimums = [max(layer.n_used",
        "minimums = [min(layer.n_used",
    ),
    _experts(
        "streamed_spare_counts_the_minimum_twice",
        STREAMED_PY,
        "spare = budget - minimum",
        "spare = budget",
    ),
    _experts(
        "streamed_cached_model_reads_one_at_a_time",
        STREAMED_PY,
        "window = self.options.read_threads",
        "window = 1",
    ),
    _experts(
        "streamed_every_expert_cached_still_reserves",
        STREAMED_PY,
        "if slots < total:",
        "if slots <= total:",
    ),
    _experts(
        "streamed_staging_share_of_the_minimum_too",
        STREAMED_PY,
        "int((slots - low) * STAGING_SHARE)",
        "int(slots * STAGING_SHARE)",
    ),
    _experts(
        "streamed_mlx_cache_limit_raised",
        STREAMED_PY,
        "min(mx.set_cache_limit(0)",
        "max(mx.set_cache_limit(0)",
    ),
    _experts(
        "streamed_auto_budget_every_expert",
        STREAMED_PY,
        "budget = AUTO_SHARE * self.routed_bytes",
        "budget = self.routed_bytes",
    ),
    _experts(
        "streamed_routed_bytes_of_the_minimums",
        STREAMED_PY,
        "self.routed_bytes = sum(b * n for b, n in zip(slot_bytes, totals, strict=True))",
        "self.routed_bytes = sum(b * n for b, n in zip(slot_bytes, minimums, strict=True))",
    ),
    # routing steps
    _experts(
        "streamed_slot_zero_counts_as_a_miss",
        STREAMED_PY,
        "cached = policy.lookup(keys) >= 0",
        "cached = policy.lookup(keys) > 0",
    ),
    _experts(
        "streamed_hits_not_summed",
        STREAMED_PY,
        "self._stats.hits += int(cached.sum())",
        "self._stats.hits = int(cached.sum())",
    ),
    _experts(
        "streamed_decode_batch_past_the_capacity",
        STREAMED_PY,
        "min(pool.capacity, pool.decode_batch)",
        "max(pool.capacity, pool.decode_batch)",
    ),
    _experts(
        "streamed_routing_of_exactly_the_capacity_split",
        STREAMED_PY,
        "if len(experts) <= batch:",
        "if len(experts) < batch:",
    ),
    _experts(
        "streamed_cached_experts_batched_last",
        STREAMED_PY,
        'order = np.argsort(~cached, kind="stable")',
        'order = np.argsort(cached, kind="stable")',
    ),
    _experts(
        "streamed_pairs_of_slot_zero_dropped",
        STREAMED_PY,
        "pairs = np.flatnonzero(pair_index >= 0)",
        "pairs = np.flatnonzero(pair_index > 0)",
    ),
    _experts(
        "streamed_one_demand_read_past_the_window",
        STREAMED_PY,
        "while todo and len(reads) < window:",
        "while todo and len(reads) <= window:",
    ),
    _experts(
        "streamed_victims_not_advanced",
        STREAMED_PY,
        "filled += 1",
        "filled = 1",
    ),
    _experts(
        "streamed_cancelled_reads_drain",
        STREAMED_PY,
        "if not read.cancel():",
        "if read.cancel():",
    ),
    _experts(
        "streamed_empty_routing_refused",
        STREAMED_PY,
        "if flat.size and (",
        "if (",
    ),
    # hot-list
    _experts(
        "streamed_hotlist_without_final_newline",
        STREAMED_PY,
        'json.dumps(document, indent=1) + "\\n"',
        "json.dumps(document, indent=1)",
    ),
    _experts(
        "streamed_hotlist_unreadable_file_unreported",
        STREAMED_PY,
        "except (OSError, UnicodeDecodeError, json.JSONDecodeError)",
        "except (UnicodeDecodeError, json.JSONDecodeError)",
    ),
    _experts(
        "streamed_hotlist_binary_file_unreported",
        STREAMED_PY,
        "except (OSError, UnicodeDecodeError, json.JSONDecodeError)",
        "except (OSError, json.JSONDecodeError)",
    ),
    _experts(
        "streamed_hotlist_list_document_crashes",
        STREAMED_PY,
        "if not isinstance(document, dict) or document.get",
        "if document.get",
    ),
    _experts(
        "streamed_hotlist_entry_without_field_crashes",
        STREAMED_PY,
        "except (KeyError, TypeError, ValueError):",
        "except (TypeError, ValueError):",
    ),
    _experts(
        "streamed_hotlist_entry_not_an_object_crashes",
        STREAMED_PY,
        "except (KeyError, TypeError, ValueError):",
        "except (KeyError, ValueError):",
    ),
    _experts(
        "streamed_hotlist_text_hotness_crashes",
        STREAMED_PY,
        "except (KeyError, TypeError, ValueError):",
        "except (KeyError, TypeError):",
    ),
    _experts(
        "streamed_hotlist_infinite_hotness_accepted",
        STREAMED_PY,
        "or not math.isfinite(hot)",
        "or hot != hot",
    ),
    _experts(
        "streamed_hotlist_rereads_slot_zero",
        STREAMED_PY,
        "if pool.policy.lookup(key)[0] < 0:",
        "if pool.policy.lookup(key)[0] <= 0:",
    ),
    # counters
    _experts(
        "streamed_stats_bytes_read_missing",
        STREAMED_PY,
        "s.bytes_read = self.reader.bytes_read",
        "s.bytes_read = self.reader.reads",
    ),
    _experts(
        "streamed_stats_reads_missing",
        STREAMED_PY,
        "s.reads = self.reader.reads",
        "s.reads = 0",
    ),
    _experts(
        "streamed_stats_read_seconds_missing",
        STREAMED_PY,
        "s.read_seconds = self.reader.read_seconds",
        "s.read_seconds = 0.0",
    ),
    _experts(
        "streamed_stats_budget_is_the_routed_bytes",
        STREAMED_PY,
        "s.budget_bytes = self.budget_bytes",
        "s.budget_bytes = self.routed_bytes",
    ),
    _experts(
        "streamed_stats_routed_bytes_missing",
        STREAMED_PY,
        "s.routed_bytes = self.routed_bytes",
        "s.routed_bytes = self.budget_bytes",
    ),
    _experts(
        "streamed_stats_live_not_a_snapshot",
        STREAMED_PY,
        "return ExpertStats(**{f.name: getattr(s, f.name) for f in fields(s)})",
        "return s",
    ),
    _experts(
        "streamed_metal_experts_decoded_in_batches",
        STREAMED_PY,
        'if PACKED_KERNELS == "metal" or',
        'if PACKED_KERNELS == "mlx" or',
    ),
    # the stores' interface: the summary line and a prefetch hint
    _experts(
        "store_summary_cache_and_capacity_swapped",
        STORE_PY,
        'f"experts: streamed, cache {format_size(self.resident_bytes)} of "',
        'f"experts: streamed, cache {format_size(self.capacity_bytes)} of "',
    ),
    _experts(
        "store_summary_budget_of_the_budget",
        STORE_PY,
        'f" of {format_size(self.routed_bytes)} routed) | hits {self.hits}, misses "',
        'f" of {format_size(self.budget_bytes)} routed) | hits {self.hits}, misses "',
    ),
    _experts(
        "store_summary_bytes_read_in_megabytes",
        STORE_PY,
        "{self.bytes_read / 2**20:.1f} MiB",
        "{self.bytes_read / 1e6:.1f} MiB",
    ),
    _experts(
        "store_summary_warm_loads_as_prefetches",
        STORE_PY,
        'f"used | warm {self.warm_loaded}"',
        'f"used | warm {self.prefetched}"',
    ),
    _experts(
        "store_prefetch_hint_without_tokens",
        STORE_PY,
        "self.layer.prefetch(self.route(x, tokens))",
        "self.layer.prefetch(self.route(x, None))",
    ),
)
