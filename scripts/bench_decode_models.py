#!/usr/bin/env python3
"""The models scripts/bench_decode.sh measures, from random weights (no
download): for each model, transformers' save_pretrained folder (`hf/`) and
Optimum's export of it without merging (`export/`: decoder_model.onnx for
prefill, decoder_with_past_model.onnx for decode steps, past and present
separate). The onnxruntime-genai model builder builds its model from the
same `hf/` folder (scripts/bench_decode.sh, in an environment of its own).

Usage: bench_decode_models.py OUT_DIR [llama] [gpt2] [bert] [tinyllama] [gptj] [opt] [llama-eager]   (default: llama gpt2 bert)
  llama: Llama, hidden 1,024, 8 layers, 16 heads of 64, 4 KV heads (grouped)
  tinyllama: TinyLlama's shape (1.1B), hidden 2,048, 22 layers, 32 heads of 64,
         4 KV heads (an export over 2 GB: external data)
  gpt2:  GPT-2 (124M)
  bert:  BERT-base encoder (feature extraction)
  gptj:  GPT-J's shape at hidden 1,024, 8 layers, 16 heads of 64, rotary on 32
  opt:   OPT at hidden 1,024, 8 layers, 16 heads of 64, without a cache
         (prefill only; its causal mask hides keys by the float's lowest)
  llama-eager: llama's weights (made first) exported by torch.onnx TorchScript
         with eager attention (a causal mask of the float's lowest), no cache,
         its sizes fixed at one row of 2,048 tokens by the trace: prefill only"""

import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402


def configs():
    return {
        "llama": (transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                           num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                           max_position_embeddings=8192, rms_norm_eps=1e-5,
                                           tie_word_embeddings=False),
                  transformers.LlamaForCausalLM, "text-generation-with-past"),
        "tinyllama": (transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                               num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                               max_position_embeddings=8192, rms_norm_eps=1e-5,
                                               tie_word_embeddings=False),
                      transformers.LlamaForCausalLM, "text-generation-with-past"),
        "gpt2": (transformers.GPT2Config(n_positions=4096), transformers.GPT2LMHeadModel, "text-generation-with-past"),
        # Interleaved rotary on 32 of each head's 64 channels; no builder
        # model (onnxruntime-genai's builder has no GPT-J).
        "gptj": (transformers.GPTJConfig(vocab_size=32000, n_embd=1024, n_layer=8, n_head=16, n_inner=4096,
                                         rotary_dim=32, n_positions=8192, tie_word_embeddings=False),
                 transformers.GPTJForCausalLM, "text-generation-with-past"),
        # No builder model (onnxruntime-genai's builder has no OPT).
        "opt": (transformers.OPTConfig(vocab_size=32000, hidden_size=1024, ffn_dim=4096, num_hidden_layers=8,
                                       num_attention_heads=16, max_position_embeddings=4096,
                                       word_embed_proj_dim=1024, tie_word_embeddings=False),
                transformers.OPTForCausalLM, "text-generation"),
        "bert": (transformers.BertConfig(), transformers.BertModel, "feature-extraction"),
    }


def save_tokenizer(folder, vocab):
    """A word-level tokenizer of the model's vocabulary, made here (the
    builder copies a tokenizer into its output and refuses a folder
    without one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2")
    fast.save_pretrained(folder)


def eager_export(out, tokens=2048):
    """llama's weights exported with eager attention (`llama-eager`)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_testdata
    gen_testdata.use_mask_without_vmap()  # TorchScript cannot trace transformers' vmap
    hf, export = os.path.join(out, "llama", "hf"), os.path.join(out, "llama-eager", "export")
    if os.path.exists(os.path.join(export, "model.onnx")):
        return
    model = transformers.LlamaForCausalLM.from_pretrained(hf, attn_implementation="eager").eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    os.makedirs(export, exist_ok=True)
    args = (torch.randint(3, 1000, (1, tokens)), torch.ones(1, tokens, dtype=torch.int64))
    with torch.no_grad():
        torch.onnx.export(Logits(), args, os.path.join(export, "model.onnx"), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["logits"])
    print(f"llama-eager: {export}")


def main():
    from optimum.exporters.onnx import main_export
    out = sys.argv[1]
    wanted = sys.argv[2:] or ["llama", "gpt2", "bert"]
    for kind in wanted:
        if kind == "llama-eager":
            eager_export(out)
            continue
        cfg, cls, task = configs()[kind]
        root = os.path.join(out, kind)
        hf, export = os.path.join(root, "hf"), os.path.join(root, "export")
        if os.path.exists(os.path.join(export, "model.onnx")) or os.path.exists(
                os.path.join(export, "decoder_with_past_model.onnx")):
            continue
        torch.manual_seed(0)
        model = cls(cfg)
        model.save_pretrained(hf)
        save_tokenizer(hf, cfg.vocab_size)
        main_export(hf, export, task=task, no_post_process=True, do_validation=False, dtype="fp32", device="cpu")
        print(f"{kind}: {export}")


if __name__ == "__main__":
    main()
