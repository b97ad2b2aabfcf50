//! Where a runtime's `Attention` kernel is worth writing: measured facts,
//! one row per runtime. Exactness is `kernel.rs`'s (a kernel is written
//! only where it computes the core's function, guarded); these rows only
//! say where an exact kernel is slower than the ops it replaces, so that
//! the core stays `AttentionCore` there. A second runtime (CUDA, where an
//! `If` costs a copy to the host and rules out CUDA graphs) is a new row,
//! not a new branch. Each fact names its benchmark in docs/benchmarks.md.

/// What one runtime's kernel gains, as measured.
pub(super) struct Speed {
    /// The runtime and version measured.
    pub runtime: &'static str,
    /// The kernel gains on a KV cache without grouped heads whose key the
    /// export only transposes, or scales by a constant. ONNX Runtime folds
    /// both into its MatMul: GPT-J, a Llama without grouped heads and T5's
    /// decoder took 0.98–1.15× the export's decode time on the kernel,
    /// 0.89–1.06× as AttentionCore ("GPT-J's rotary, and a cache without
    /// grouped heads"). Where the export scales the key by a value it
    /// computes at run time (GPT-2) the kernel gains (0.83–0.90×).
    pub plain_cache: bool,
    /// The kernel gains on an encoder's 4-D heads (not read as the merged
    /// `[b, s, h·d]` values the model computes): within the guard's cost
    /// and the machine's spread on ONNX Runtime, where the merged 3-D form
    /// takes 0.62–0.79× ("An encoder's attention as one kernel").
    pub four_d_heads: bool,
    /// The kernel gains on an encoder whose masks are replayed over every
    /// head's scores (DeBERTa's relative terms, MPNet's position bias, with
    /// a padding mask): the guard reads that score-sized mask some ten
    /// times. DeBERTa-base at 512 tokens took 1.05–1.07× AttentionCore,
    /// MPNet-base 0.99–1.05× ("Folded heads, two masks, and where the
    /// prefill time goes").
    pub replayed_masks: bool,
    /// The kernel gains on one key and value head that the products
    /// broadcast over the query heads (multi-query attention, Falcon's
    /// export): the MatMuls broadcast it without copying, where the kernel
    /// took 2.1–2.8× their time for one token at a past of 128 to 4,096
    /// (16 heads of 64; "Multi-query attention on the kernel").
    pub broadcast_heads: bool,
    /// The kernel gains on a core whose heads are folded into its batch
    /// and never split (`[b·h, s, d]` throughout, no view of the scores:
    /// torch's `nn.MultiheadAttention`), read as one head of the kernel's
    /// 3-D form. ONNX Runtime's took 0.98–1.00× the core's time on prompts
    /// of 128 and 512 tokens and at a past of 1,024, before its guard's
    /// cost; 0.43–0.46× for one token at a past of 128 ("Heads folded into
    /// the batch, one head to the kernel").
    pub batch_heads: bool,
    /// The query length from which a call runs the kernel over pieces of
    /// its queries, each reading only the keys its rows see, and how many
    /// pieces ("Rows hidden whole, lifted, and a long prompt in pieces";
    /// "Each piece reads the keys it sees").
    pub long_queries: i64,
    pub query_pieces: usize,
}

/// ONNX Runtime's CPU provider (1.31.1, 2 threads, `ORT_ENABLE_ALL`).
pub(super) const ORT_CPU: Speed = Speed {
    runtime: "ONNX Runtime's Attention",
    plain_cache: false,
    four_d_heads: false,
    replayed_masks: false,
    broadcast_heads: false,
    batch_heads: false,
    long_queries: 1024,
    query_pieces: 8,
};

/// `--target portable`: no runtime's speed is known, and `Attention` is
/// written wherever it computes the core without a guard (`kernel.rs`).
pub(super) const PORTABLE: Speed = Speed {
    runtime: "ONNX's Attention",
    plain_cache: true,
    four_d_heads: true,
    replayed_masks: true,
    broadcast_heads: true,
    batch_heads: true,
    long_queries: i64::MAX,
    query_pieces: 1,
};
