#!/usr/bin/env python3
"""Builds the tiny random-weight exports in testdata/.

Every model is made from a transformers config in this file (no weights are
downloaded: HF_HUB_OFFLINE=1), with a fixed seed, and exported by the real
exporters: torch.onnx's TorchScript exporter, its dynamo exporter, and
Optimum. The near-miss models (one per precondition the fusion passes check)
are made by editing a real export with the onnx package, so they differ from
a fusable model in exactly one point.

Writes testdata/*.onnx and testdata/MANIFEST.json (where each file came
from). Run it through scripts/gen_testdata.sh, which makes the environment.
"""

import json
import os
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from onnx import helper, numpy_helper, TensorProto  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testdata")
MANIFEST = {}

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)


def configs():
    """The transformers configs: tiny, but of the real model classes."""
    t = transformers
    return {
        "llama": t.LlamaConfig(**SMALL, num_key_value_heads=2, rms_norm_eps=1e-6),
        "gemma": t.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6),
        "qwen2": t.Qwen2Config(**SMALL, num_key_value_heads=2, rms_norm_eps=1e-5),
        "gpt2": t.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                             layer_norm_epsilon=1e-5),
        "bert": t.BertConfig(**SMALL, type_vocab_size=2, layer_norm_eps=1e-12),
        "t5": t.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         layer_norm_epsilon=1e-6, decoder_start_token_id=0),
        "mistral": t.MistralConfig(**SMALL, num_key_value_heads=2, rms_norm_eps=1e-5, sliding_window=None),
        "roberta": t.RobertaConfig(**SMALL, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1),
        "vit": t.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           image_size=16, patch_size=8, num_channels=3),
        "trocr": t.TrOCRConfig(vocab_size=64, d_model=32, decoder_layers=2, decoder_attention_heads=4,
                               decoder_ffn_dim=64, max_position_embeddings=64, cross_attention_hidden_size=32,
                               pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
        "whisper": t.WhisperConfig(vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=4, decoder_attention_heads=4,
                                   encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                                   max_source_positions=16, max_target_positions=32,
                                   decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, suppress_tokens=[], begin_suppress_tokens=[]),
        # Encoders with a relative position bias or masked_fill, LayerNorms
        # without bias, ALiBi decoders, position ids computed from the mask.
        "mpnet": t.MPNetConfig(**SMALL, pad_token_id=1, layer_norm_eps=1e-12),
        "distilbert": t.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                         max_position_embeddings=64, pad_token_id=0),
        "modernbert": t.ModernBertConfig(**SMALL, pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=3,
                                         sep_token_id=4, global_attn_every_n_layers=2, local_attention=4,
                                         reference_compile=False),
        "opt": t.OPTConfig(vocab_size=64, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=2,
                           eos_token_id=2),
        "bloom": t.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4, layer_norm_epsilon=1e-5),
        "mpt": t.MptConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64),
        # LayerNorm with neither weight nor bias.
        "olmo": t.OlmoConfig(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        # Disentangled attention: a relative position bias gathered through
        # an If whose condition only shapes decide, and a Reshape pair
        # around the softmax.
        "deberta": t.DebertaV2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                                     position_buckets=8, pos_att_type=["p2c", "c2p"], max_relative_positions=16,
                                     layer_norm_eps=1e-7, pad_token_id=0, type_vocab_size=0),
        # Attention written with Einsums (torch.einsum), a relative position
        # term added and the mask subtracted (`score - 1e30 * mask`).
        "xlnet": t.XLNetConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, d_inner=64, pad_token_id=0),
        # Speech: a convolved and pooled sequence of symbolic length
        # (floor(len / 2) written two ways) before every residual norm.
        "sew": t.SEWConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=4, squeeze_factor=2),
        # Position embeddings interpolated to the image's grid: the grid's
        # side is `Cast(Pow(4.0, 0.5))`, a bicubic Resize to given sizes.
        "dinov2": t.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2,
                                 image_size=16, patch_size=8),
        # A convolutional position embedding one step longer than its input,
        # cut back by `[:, :, :-1]` and transposed, added before the
        # encoder's first norm (wav2vec2 and WavLM write it the same way).
        "hubert": t.HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                 num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
        # Transient-global attention: the global tokens' RMSNorm reads an
        # Einsum with an ellipsis (`...nd,...ng->...gd`).
        "longt5": t.LongT5Config(vocab_size=64, d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                                 encoder_attention_type="transient-global", global_block_size=4, local_radius=2,
                                 decoder_start_token_id=0),
        # The parallel residual, x + attn(ln1(x)) + mlp(ln2(x)): the next
        # layer's two norms read one sum; rotary on a quarter of each head.
        "neox": t.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64, use_parallel_residual=True),
        # Interleaved rotary (`rotate_every_two`: pairs, not halves) on the
        # first half of each head, with `repeat_interleave`d sin and cos, on
        # heads laid out [b, s, heads, d] (GPT-J; CodeGen writes the same).
        "gptj": t.GPTJConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=64,
                             rotary_dim=4),
        # Dynamic convolution beside attention: unfolded values times a
        # softmax over the kernel (`x · softmax`, no attention core).
        "convbert": t.ConvBertConfig(vocab_size=64, hidden_size=32, embedding_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64),
        # Pooled residuals: each block after the first starts from
        # avg_pool(kernel 2, stride 2, ceil_mode) over the sequence.
        "funnel": t.FunnelConfig(vocab_size=64, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1, 1],
                                 num_decoder_layers=1),
        # Patches unfolded at `math.ceil(h / 2) * 2` rows, traced as float
        # arithmetic on the feature map's sizes (Cast, Div, Ceil, Mul,
        # Cast back), height and width dynamic.
        "mobilevit": t.MobileViTConfig(image_size=32, patch_size=2, hidden_sizes=[16, 24, 32],
                                       neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=4,
                                       expand_ratio=2.0),
        # Shifted windows over a feature map padded to whole windows, merged
        # by patches (`x[:, 0::2, 0::2]`); exported with height and width
        # dynamic (`swin_hw_ts_op14.onnx`).
        "swin": t.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4),
        # Interleaved rotary whose tables torch's general repeat_interleave
        # writes (a mask's NonZero indices, GatherND): after cos and sin
        # (Cohere, its LayerNorm without bias), or on tables cut to the
        # rotary half of each head (GLM).
        "cohere": t.CohereConfig(**SMALL, num_key_value_heads=2),
        "glm": t.GlmConfig(**SMALL, num_key_value_heads=2, head_dim=8, pad_token_id=0),
        # Soft-capped attention scores (and logits), sliding-window layers.
        # Each head's q and k normalized (RMSNorm over the head's 8 values,
        # on [b, s, h, d] before the heads' Transpose) ahead of rotary.
        "qwen3": t.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6),
        # Rotary with the halves turned and written apart
        # (`_apply_rotary_emb`: cat(x1·cos − x2·sin, x2·cos + x1·sin) with
        # tables of half a head); attention sinks (the softmax over the
        # scores and a sink column, no attention core); experts.
        # Protein language model (ESM-2): q scaled twice before its
        # product (by 1/√d, then by the eager path's scaling of 1).
        "esm": t.EsmConfig(**SMALL, pad_token_id=1, mask_token_id=2),
        "gpt_oss": t.GptOssConfig(**SMALL, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                  num_experts_per_tok=2, sliding_window=8),
        "gemma2": t.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                 query_pre_attn_scalar=8, sliding_window=4),
    }


def use_mask_without_vmap():
    """transformers builds causal masks with torch.vmap on torch >= 2.6, which
    the TorchScript exporter cannot trace; its pre-2.6 code path makes the
    same mask with plain tensor ops (Optimum patches it the same way)."""
    mu = transformers.masking_utils
    mu.sdpa_mask = mu.sdpa_mask_older_torch
    mu.AttentionMaskInterface._global_mapping["sdpa"] = mu.sdpa_mask_older_torch


def build(kind, attn="eager"):
    torch.manual_seed(0)
    cfg = configs()[kind]
    cfg._attn_implementation = attn
    t = transformers
    if kind == "t5":
        model = t.T5EncoderModel(cfg)
    elif kind == "roberta":
        model = t.RobertaModel(cfg)
    elif kind == "vit":
        model = t.ViTModel(cfg)
    elif kind == "trocr":
        model = t.TrOCRForCausalLM(cfg)
    elif kind == "whisper":
        model = t.WhisperModel(cfg).get_encoder()
    elif kind == "sew":
        model = t.SEWModel(cfg)
    elif kind == "hubert":
        model = t.HubertModel(cfg)
    elif kind == "dinov2":
        model = t.Dinov2Model(cfg)
    elif kind == "longt5":
        model = t.LongT5EncoderModel(cfg)
    elif kind == "bert":
        model = t.BertModel(cfg)
    elif kind == "funnel":
        model = t.FunnelBaseModel(cfg)
    elif kind == "mobilevit":
        model = t.MobileViTModel(cfg)
    elif kind == "swin":
        model = t.SwinModel(cfg)
    elif kind in ENCODERS:
        model = t.AutoModel.from_config(cfg, attn_implementation=attn)
    else:
        model = t.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    return model.eval()


# Encoders built with AutoModel: no cache, no logits.
ENCODERS = ("mpnet", "distilbert", "modernbert", "deberta", "xlnet", "convbert", "funnel")


class Wrap(torch.nn.Module):
    """Gives every model a plain tensor in, tensor out forward()."""

    def __init__(self, model, kind):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x, mask=None):
        if self.kind == "whisper":
            return self.model(input_features=x).last_hidden_state
        if self.kind in ("sew", "hubert"):
            return self.model(input_values=x).last_hidden_state
        if self.kind in ("vit", "dinov2", "mobilevit", "swin"):
            return self.model(pixel_values=x).last_hidden_state
        if self.kind == "trocr":
            return self.model(input_ids=x, attention_mask=mask, use_cache=False).logits
        out = self.model(input_ids=x, attention_mask=mask, use_cache=False) \
            if self.kind not in ("t5", "longt5", "bert", "roberta") + ENCODERS \
            else self.model(input_ids=x, attention_mask=mask)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def sample_inputs(kind):
    if kind == "whisper":
        return (torch.randn(1, 16, 32),), ["input_features"], {"input_features": {0: "batch"}}
    if kind in ("vit", "dinov2"):
        return (torch.randn(1, 3, 16, 16),), ["pixel_values"], {"pixel_values": {0: "batch"}}
    if kind in ("mobilevit", "swin"):
        return (torch.randn(1, 3, 32, 32),), ["pixel_values"], {"pixel_values": {0: "batch", 2: "h", 3: "w"}}
    if kind in ("sew", "hubert"):
        return (torch.randn(1, 400),), ["input_values"], {"input_values": {0: "batch", 1: "len"}}
    ids = torch.randint(0, 64, (1, 7))
    mask = torch.ones(1, 7, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    return (ids, mask), ["input_ids", "attention_mask"], axes


def record(name, **how):
    MANIFEST[name] = how
    print(f"wrote {name}", file=sys.stderr)


def export_torch(name, kind, *, opset, dynamo=False, fp16=False, attn="eager", optimize=True, axes=None):
    model = build(kind, attn)
    if fp16:
        model = model.half()
    args, names, sample_axes = sample_inputs(kind)
    axes = axes or sample_axes
    if fp16 and kind in ("whisper", "vit"):
        args = (args[0].half(),)
    path = os.path.join(OUT, name)
    wrapped = Wrap(model, kind)
    if dynamo:
        torch.onnx.export(wrapped, args, path, input_names=names, output_names=["out"],
                          opset_version=opset, dynamo=True, optimize=optimize,
                          dynamic_shapes=None, external_data=False)
    else:
        torch.onnx.export(wrapped, args, path, input_names=names, output_names=["out"],
                          dynamic_axes=axes, opset_version=opset, dynamo=False,
                          do_constant_folding=True)
    record(name, model=kind, exporter="torch.onnx dynamo" if dynamo else "torch.onnx TorchScript",
           opset=opset, dtype="float16" if fp16 else "float32", attention=attn, exporter_optimizer=optimize,
           config=configs()[kind].to_diff_dict())


class FeatureMapNorms(torch.nn.Module):
    """LayerNorms over more than the last axis, as vision models write them:
    over a feature map's (H, W) with a weight and bias of that shape, and
    over (C, H, W) without either."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.LayerNorm((16, 16))
        self.norm2 = torch.nn.LayerNorm((8, 16, 16), elementwise_affine=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm2(torch.relu(self.norm(self.conv(x))))


def export_feature_map_norms(name, *, opset):
    torch.manual_seed(0)
    model = FeatureMapNorms().eval()
    path = os.path.join(OUT, name)
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), path, input_names=["pixel_values"],
                      output_names=["out"], dynamic_axes={"pixel_values": {0: "batch"}}, opset_version=opset,
                      dynamo=False)
    record(name, model="FeatureMapNorms (scripts/gen_testdata.py)", exporter="torch.onnx TorchScript", opset=opset,
           dtype="float32")


class MultiheadEncoder(torch.nn.Module):
    """torch's nn.MultiheadAttention as encoders use it (DETR, CLIP): two
    pre-norm layers, with need_weights (its default), whose export keeps
    the heads folded into the batch, [b·h, s, d], with no view of the
    scores. TorchScript traces its sizes: exported with static shapes."""

    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(32) for _ in range(2))
        self.attn = torch.nn.ModuleList(torch.nn.MultiheadAttention(32, 4, batch_first=True) for _ in range(2))

    def forward(self, x):
        for norm, attn in zip(self.norms, self.attn):
            h = norm(x)
            y, _ = attn(h, h, h)
            x = x + y
        return x


def export_multihead_encoder(name, *, opset):
    torch.manual_seed(0)
    model = MultiheadEncoder().eval()
    path = os.path.join(OUT, name)
    torch.onnx.export(model, (torch.randn(2, 7, 32),), path, input_names=["x"], output_names=["out"],
                      opset_version=opset, dynamo=False)
    record(name, model="MultiheadEncoder (scripts/gen_testdata.py: torch.nn.MultiheadAttention)",
           exporter="torch.onnx TorchScript", opset=opset, dtype="float32", shapes="static")


class Seq2Seq(torch.nn.Module):
    """Encoder and decoder in one graph (cross-attention included)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids):
        return self.model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits


def export_t5_seq2seq(name, *, opset):
    torch.manual_seed(0)
    cfg = configs()["t5"]
    cfg._attn_implementation = "eager"
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    args = (torch.randint(0, 64, (1, 7)), torch.randint(0, 64, (1, 5)))
    torch.onnx.export(Seq2Seq(model), args, os.path.join(OUT, name), input_names=["input_ids", "decoder_input_ids"],
                      output_names=["out"], opset_version=opset, dynamo=False)
    record(name, model="t5", exporter="torch.onnx TorchScript", opset=opset, dtype="float32",
           what="T5ForConditionalGeneration: encoder, decoder self- and cross-attention", config=cfg.to_diff_dict())


def export_optimum(name, kind, task, *, opset=None, fp16=False, file="model.onnx"):
    from optimum.exporters.onnx import main_export
    torch.manual_seed(0)
    cfg = configs()[kind]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        if kind == "bert":
            transformers.BertModel(cfg).save_pretrained(src)
        elif kind == "t5":
            transformers.T5ForConditionalGeneration(cfg).save_pretrained(src)
        elif kind == "esm":
            transformers.EsmModel(cfg).save_pretrained(src)
        else:
            transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(src)
        kw = dict(opset=opset) if opset else {}
        main_export(src, dst, task=task, no_post_process=True, do_validation=False,
                    dtype="fp16" if fp16 else "fp32", device="cpu", **kw)
        model = onnx.load(os.path.join(dst, file))
        onnx.save(model, os.path.join(OUT, name))
    record(name, model=kind, exporter="optimum main_export", task=task, file=file, opset=opset or "default",
           dtype="float16" if fp16 else "float32", config=cfg.to_diff_dict())


def export_optimum_folder(name, kind, task, *, merged):
    """A whole Optimum export folder (models, configs), as `onnx-fuse FOLDER
    -o OUT` takes it: testdata/NAME/. With `merged`, a decoder-only model
    exported without and with past, and the two merged by Optimum's
    merge_decoders into decoder_model_merged.onnx (If branches on
    use_cache_branch), as Optimum's decoder folders hold them."""
    from optimum.exporters.onnx import main_export
    torch.manual_seed(0)
    cfg = configs()[kind]
    dst = os.path.join(OUT, name)
    shutil.rmtree(dst, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        if kind == "t5":
            transformers.T5ForConditionalGeneration(cfg).save_pretrained(src)
        else:
            transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(src)
        if not merged:
            main_export(src, dst, task=task, no_post_process=True, do_validation=False, dtype="fp32", device="cpu")
        else:
            from optimum.exporters.onnx.model_configs import GPT2OnnxConfig, LlamaOnnxConfig
            from optimum.onnx import merge_decoders
            config_class = {"llama": LlamaOnnxConfig, "gpt2": GPT2OnnxConfig}[kind]
            # The first decoder takes no past but returns the present, as
            # Optimum's decoder_model.onnx does.
            for past_in, file in [(False, "decoder_model.onnx"), (True, "decoder_with_past_model.onnx")]:
                out = os.path.join(tmp, file)
                onnx_config = config_class(cfg, task="text-generation", use_past=True, use_past_in_inputs=past_in)
                main_export(src, out, task=task, no_post_process=True, do_validation=False, dtype="fp32", device="cpu",
                            custom_onnx_configs={"model": onnx_config})
                os.makedirs(dst, exist_ok=True)
                shutil.copy(os.path.join(out, "model.onnx"), os.path.join(dst, file))
                for extra in os.listdir(out):
                    if not extra.endswith(".onnx"):
                        shutil.copy(os.path.join(out, extra), os.path.join(dst, extra))
            merge_decoders(os.path.join(dst, "decoder_model.onnx"), os.path.join(dst, "decoder_with_past_model.onnx"),
                           save_path=os.path.join(dst, "decoder_model_merged.onnx"), strict=False)
    files = sorted(os.listdir(dst))
    record(name, model=kind, exporter="optimum main_export (folder)", task=task, files=files,
           merged_decoder=merged, config=cfg.to_diff_dict())


# --- near-misses: one precondition broken in a real export -------------------

def load(name):
    return onnx.load(os.path.join(OUT, name))


def set_int_attr(node, name, value):
    """Sets (or adds) an int attribute of a node."""
    for a in node.attribute:
        if a.name == name:
            a.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))


def also_output(model, value):
    """Makes an intermediate value a graph output too."""
    model.graph.output.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, None))


def save_near_miss(model, name, base, what):
    onnx.save(model, os.path.join(OUT, name))
    record(name, near_miss_of=base, broken=what)


def first(model, op, pred=lambda n: True):
    return next(n for n in model.graph.node if n.op_type == op and pred(n))


def const_node(model, value_name):
    """The Constant node or initializer that defines value_name."""
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] == value_name:
            return n
    for t in model.graph.initializer:
        if t.name == value_name:
            return t
    raise KeyError(value_name)


def set_const(model, value_name, array):
    c = const_node(model, value_name)
    t = numpy_helper.from_array(np.asarray(array), value_name)
    if isinstance(c, onnx.TensorProto):
        c.CopyFrom(t)
    else:
        c.attribute[0].t.CopyFrom(t)


def consumers(model, value):
    return [n for n in model.graph.node if value in n.input]


def near_misses_rms(base):
    """Each near-miss breaks exactly one precondition of rms-norm in `base`."""
    m = load(base)
    pow_ = first(m, "Pow")
    set_const(m, pow_.input[1], np.array(3.0, dtype=np.float32))
    save_near_miss(m, "nm_rms_exponent3.onnx", base, "exponent 3")

    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    add = consumers(m, rm.output[0])[0]
    eps_in = [i for i in add.input if i != rm.output[0]][0]
    # eps becomes a graph input: no longer a constant.
    m.graph.input.append(helper.make_tensor_value_info("eps_input", TensorProto.FLOAT, []))
    add.input[list(add.input).index(eps_in)] = "eps_input"
    save_near_miss(m, "nm_rms_eps_not_constant.onnx", base, "eps not constant")

    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    set_axes(m, rm, [0])
    save_near_miss(m, "nm_rms_axis0.onnx", base, "ReduceMean over axis 0")

    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    set_int_attr(rm, "keepdims", 0)
    save_near_miss(m, "nm_rms_keepdims0.onnx", base, "keepdims 0")

    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    also_output(m, rm.output[0])
    save_near_miss(m, "nm_rms_intermediate_output.onnx", base,
                   "an intermediate (the ReduceMean) is also a graph output")

    m = load(base)
    weight = rms_weight(m)
    t = next(t for t in m.graph.initializer if t.name == weight)
    arr = numpy_helper.to_array(t)
    t.CopyFrom(numpy_helper.from_array(np.stack([arr] * 2), weight))
    save_near_miss(m, "nm_rms_weight_2d.onnx", base, "a [2, D] weight (a [1, D] one is the same function)")


    m = load(base)
    div = first(m, "Div", lambda n: n.input[1] == first(m, "Sqrt").output[0])
    set_const(m, div.input[0], np.array(2.0, dtype=np.float32))
    save_near_miss(m, "nm_rms_numerator2.onnx", base, "Div(2, sqrt): numerator not 1")

    m = load(base)
    weight = rms_weight(m)
    mul = first(m, "Mul", lambda n: weight in n.input)
    m.graph.input.append(helper.make_tensor_value_info("weight_input", TensorProto.FLOAT, [32]))
    mul.input[list(mul.input).index(weight)] = "weight_input"
    # Not a near-miss: a weight of proved shape [D] need not be a constant.
    onnx.save(m, os.path.join(OUT, "rms_weight_graph_input.onnx"))
    record("rms_weight_graph_input.onnx", edit_of=base,
           edited="the weight is a graph input of declared shape [32] (an equivalent: its shape is proved [D])")

    m = load(base)
    pow_ = first(m, "Pow")
    other = helper.make_node("Neg", [pow_.input[0]], ["nm_negated"], name="nm_Neg")
    m.graph.node.insert(list(m.graph.node).index(pow_), other)
    pow_.input[0] = "nm_negated"
    save_near_miss(m, "nm_rms_square_of_other_value.onnx", base, "the square reads another value than the numerator")


def near_misses_rms_op18(base):
    """ReduceMean takes its axes as an input from opset 18 on."""
    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    del rm.input[1:]
    save_near_miss(m, "nm_rms_op18_no_axes.onnx", base, "ReduceMean without axes: all axes")

    m = load(base)
    rm = first(m, "ReduceMean", lambda n: n.input[0] == first(m, "Pow").output[0])
    m.graph.input.append(helper.make_tensor_value_info("axes_input", TensorProto.INT64, [1]))
    rm.input[1] = "axes_input"
    save_near_miss(m, "nm_rms_op18_axes_not_constant.onnx", base, "ReduceMean axes not a constant")


def rms_weight(m):
    """The weight initializer of the first RMSNorm in m."""
    inits = {t.name for t in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Mul":
            ws = [i for i in n.input if i in inits and "norm" in i]
            if ws:
                return ws[0]
    raise KeyError("no norm weight")


def set_axes(m, node, axes):
    for a in node.attribute:
        if a.name == "axes":
            del a.ints[:]
            a.ints.extend(axes)
            return
    if len(node.input) > 1:
        name = node.name + "_nm_axes"
        m.graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), name))
        node.input[1] = name
    else:
        node.attribute.append(helper.make_attribute("axes", axes))


def near_misses_ln(base):
    m = load(base)
    sub = first(m, "Sub")
    rm0 = next(n for n in m.graph.node if n.output[0] in sub.input and n.op_type == "ReduceMean")
    set_axes(m, rm0, [0])
    save_near_miss(m, "nm_ln_mean_axis0.onnx", base, "the mean's ReduceMean over axis 0")

    m = load(base)
    sub = first(m, "Sub")
    also_output(m, sub.output[0])
    save_near_miss(m, "nm_ln_centered_output.onnx", base, "the centered value is also a graph output")

    m = load(base)
    add = next(n for n in m.graph.node if n.op_type == "Add" and any(i.endswith("ln_1.bias") for i in n.input))
    bias = next(i for i in add.input if i.endswith("ln_1.bias"))
    t = next(t for t in m.graph.initializer if t.name == bias)
    t.CopyFrom(numpy_helper.from_array(np.stack([numpy_helper.to_array(t)] * 2), bias))
    save_near_miss(m, "nm_ln_beta_2d.onnx", base, "a [2, D] beta (a [1, D] one is the same function)")

    m = load(base)
    sub = first(m, "Sub")
    rm0 = next(n for n in m.graph.node if n.output[0] in sub.input and n.op_type == "ReduceMean")
    other = helper.make_node("Neg", [rm0.input[0]], ["nm_negated"], name="nm_Neg")
    m.graph.node.insert(list(m.graph.node).index(rm0), other)
    rm0.input[0] = "nm_negated"
    save_near_miss(m, "nm_ln_mean_of_other_value.onnx", base, "the mean is of another value than x")


def near_misses_attention():
    """Each breaks one precondition of the attention pass in one layer."""
    base = "gpt2_ts_op14.onnx"
    m = load(base)
    where = first(m, "Where", lambda n: "attn" in n.name)
    set_const(m, where.input[2], np.array(-100.0, dtype=np.float32))
    save_near_miss(m, "nm_attn_fill_minus100.onnx", base, "Where fill -100: hidden keys keep weight")

    base = "llama_ts_op14.onnx"
    m = load(base)
    mul = first(m, "Mul", lambda n: n.name.endswith("self_attn/Mul_8"))
    c = numpy_helper.to_array(const_node(m, mul.input[1]).attribute[0].t)
    set_const(m, mul.input[1], np.array([c, c], dtype=np.float32))
    save_near_miss(m, "nm_attn_scale_2_values.onnx", base, "a scale of two values")

    m = load(base)
    mul = first(m, "Mul", lambda n: n.name.endswith("self_attn/Mul_8"))
    also_output(m, mul.output[0])
    save_near_miss(m, "nm_attn_scores_output.onnx", base, "the scaled scores are also a graph output")

    m = load(base)
    sm = first(m, "Softmax")
    m.graph.node.append(helper.make_node("ReduceSum", [sm.output[0]], ["nm_prob_sum"], name="nm_ReduceSum", keepdims=0))
    m.graph.output.append(helper.make_tensor_value_info("nm_prob_sum", TensorProto.FLOAT, None))
    save_near_miss(m, "nm_attn_probs_second_consumer.onnx", base, "the probabilities are read by a second node")

    base = "llama_ts_op12.onnx"
    m = load(base)
    sm = first(m, "Softmax")
    set_int_attr(sm, "axis", 1)
    save_near_miss(m, "nm_attn_softmax_axis1_op12.onnx", base, "Softmax(axis=1) before opset 13: flattens axes 1..")

    base = "trocr_decoder_ts_op14.onnx"
    m = load(base)
    sm = first(m, "Softmax")
    back = next(n for n in m.graph.node if n.output[0] == sm.input[0])  # the Reshape back to 3-D
    concat = next(n for n in m.graph.node if n.output[0] == back.input[1])
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    save_near_miss(m, "nm_attn_reshape_not_back.onnx", base,
                   "the Reshape back gives (tgt, bsz*heads, src): not the shape it began with")


def rms_chain(prefix, x, eps_name, weight_name):
    """The primitive RMSNorm chain, as nodes (for hand-made subgraph bodies)."""
    mk = helper.make_node
    return [
        mk("Pow", [x, "two"], [prefix + "sq"], name=prefix + "Pow"),
        mk("ReduceMean", [prefix + "sq"], [prefix + "mean"], name=prefix + "ReduceMean", axes=[-1]),
        mk("Add", [prefix + "mean", eps_name], [prefix + "var"], name=prefix + "Add"),
        mk("Sqrt", [prefix + "var"], [prefix + "rms"], name=prefix + "Sqrt"),
        mk("Div", [x, prefix + "rms"], [prefix + "normed"], name=prefix + "Div"),
        mk("Mul", [prefix + "normed", weight_name], [prefix + "out"], name=prefix + "Mul"),
    ]


def subgraph_models():
    """RMSNorms inside If branches, reading eps, the exponent and the weight
    from the enclosing graph (ground rules 4 and 5), and an outer RMSNorm
    whose intermediate a branch reads (ground rule 2: must not fuse)."""
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
              numpy_helper.from_array(np.array(1e-6, dtype=np.float32), "eps"),
              numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "weight")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 16])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    then_body = helper.make_graph(rms_chain("/then/", "x", "eps", "weight"), "then", [],
                                  [helper.make_tensor_value_info("/then/out", TensorProto.FLOAT, ["batch", 5, 16])])
    else_nodes = [helper.make_node("Neg", ["x"], ["/else/neg"], name="/else/Neg")] + \
        rms_chain("/else/", "/else/neg", "eps", "weight")
    else_body = helper.make_graph(else_nodes, "else", [],
                                  [helper.make_tensor_value_info("/else/out", TensorProto.FLOAT, ["batch", 5, 16])])
    node = helper.make_node("If", ["cond"], ["y"], name="/If", then_branch=then_body, else_branch=else_body)
    graph = helper.make_graph([node], "subgraphs", [x, cond], [y], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="gen_testdata")
    model.ir_version = 7
    onnx.save(model, os.path.join(OUT, "if_branches_rms.onnx"))
    record("if_branches_rms.onnx", made_by="onnx.helper", what="RMSNorm in both If branches, constants from the outer graph")

    # The outer norm's mean is also read by a branch: it escapes.
    outer = rms_chain("/outer/", "x", "eps", "weight")
    leak = helper.make_graph([helper.make_node("Identity", ["/outer/mean"], ["/leak/out"], name="/leak/Identity")],
                             "leak", [], [helper.make_tensor_value_info("/leak/out", TensorProto.FLOAT, ["batch", 5, 1])])
    keep = helper.make_graph([helper.make_node("Identity", ["/outer/out"], ["/keep/out"], name="/keep/Identity")],
                             "keep", [], [helper.make_tensor_value_info("/keep/out", TensorProto.FLOAT, ["batch", 5, 16])])
    node = helper.make_node("If", ["cond"], ["y"], name="/If", then_branch=leak, else_branch=keep)
    graph = helper.make_graph(outer + [node], "escape", [x, cond], [y], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="gen_testdata")
    model.ir_version = 7
    save_near_miss(model, "nm_rms_read_by_subgraph.onnx", "(hand-made)", "the mean is read inside an If branch")


def external_data_model(base):
    """The same export with every tensor in one external data file."""
    m = load(base)
    folder = os.path.join(OUT, "external")
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.remove(os.path.join(folder, f))
    onnx.save(m, os.path.join(folder, "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.weights", size_threshold=0)
    record("external/model.onnx", external_data_of=base, location="model.weights")


def complex_models():
    """The decomposed complex product (the seed's pattern) beside the
    com.microsoft op, to check verification's reference functions."""
    mk = helper.make_node
    for op, re_op, im_terms in [("ComplexMul", "Sub", ("rr_i", "ri", "ir")), ("ComplexMulConj", "Add", ("im_c", "ir", "ri"))]:
        a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [3, 4, 2])
        b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [3, 4, 2])
        c = helper.make_tensor_value_info("C", TensorProto.FLOAT, [3, 4, 2])
        idx = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
               numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
               numpy_helper.from_array(np.array([-1], dtype=np.int64), "last")]
        im_op = "Add" if op == "ComplexMul" else "Sub"
        nodes = [
            mk("Gather", ["A", "zero"], ["ar"], axis=-1), mk("Gather", ["A", "one"], ["ai"], axis=-1),
            mk("Gather", ["B", "zero"], ["br"], axis=-1), mk("Gather", ["B", "one"], ["bi"], axis=-1),
            mk("Mul", ["ar", "br"], ["rr"]), mk("Mul", ["ai", "bi"], ["ii"]),
            mk("Mul", ["ar", "bi"], ["ri"]), mk("Mul", ["ai", "br"], ["ir"]),
            mk(re_op, ["rr", "ii"], ["re"]),
            mk(im_op, [im_terms[1], im_terms[2]], ["im"]),
            mk("Unsqueeze", ["re", "last"], ["re1"]), mk("Unsqueeze", ["im", "last"], ["im1"]),
            mk("Concat", ["re1", "im1"], ["C"], axis=-1),
        ]
        for i, n in enumerate(nodes):
            n.name = f"/complex/{n.op_type}_{i}"
        model = helper.make_model(helper.make_graph(nodes, "complex", [a, b], [c], initializer=idx),
                                  opset_imports=[helper.make_opsetid("", 17)], producer_name="gen_testdata")
        model.ir_version = 8
        name = f"complex_{op}_decomposed.onnx"
        onnx.save(model, os.path.join(OUT, name))
        record(name, made_by="onnx.helper", what=f"{op} written as Gathers, Muls, {re_op}/{im_op}, Unsqueezes, Concat")
        fused = helper.make_model(
            helper.make_graph([mk(op, ["A", "B"], ["C"], domain="com.microsoft", name=f"/complex/{op}")], "complex", [a, b], [c]),
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], producer_name="gen_testdata")
        fused.ir_version = 8
        name = f"complex_{op}_op.onnx"
        onnx.save(fused, os.path.join(OUT, name))
        record(name, made_by="onnx.helper", what=f"com.microsoft.{op}(A, B), CUDA-only in ONNX Runtime")


class ComplexProduct(torch.nn.Module):
    """Complex products over a trailing (real, imag) axis, written the ways
    model code writes them."""

    def __init__(self, style, conj=False):
        super().__init__()
        self.style, self.conj = style, conj

    def parts(self, x):
        if self.style == "index":
            return x[..., 0], x[..., 1]
        if self.style == "unbind":
            return x.unbind(-1)
        if self.style == "slice":
            return x[..., 0:1], x[..., 1:2]
        if self.style == "split":
            r, i = x.split(1, dim=-1)
            return r, i
        raise ValueError(self.style)

    def forward(self, a, b):
        ar, ai = self.parts(a)
        br, bi = self.parts(b)
        if self.conj:
            re, im = ar * br + ai * bi, ai * br - ar * bi
        else:
            re, im = ar * br - ai * bi, ar * bi + ai * br
        if self.style in ("slice", "split"):
            return torch.cat([re, im], dim=-1)
        return torch.stack([re, im], dim=-1)


class ComplexRotary(torch.nn.Module):
    """Rotary embedding as a complex product without view_as_complex: the
    head dimension viewed as pairs, times (cos, sin) pairs."""

    def forward(self, x, freqs):
        pairs = x.reshape(x.shape[0], x.shape[1], -1, 2)
        xr, xi = pairs[..., 0], pairs[..., 1]
        c, s = freqs[..., 0], freqs[..., 1]
        out = torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1)
        return out.reshape(x.shape)


def complex_exports():
    """The real exporters' forms of complex products (torch.onnx TorchScript and dynamo)."""
    a, b = torch.randn(3, 4, 2), torch.randn(3, 4, 2)
    jobs = []
    for style in ("index", "unbind", "slice", "split"):
        for conj in (False, True):
            jobs.append((f"cmul_{style}{'_conj' if conj else ''}", ComplexProduct(style, conj), (a, b), ["a", "b"]))
    jobs.append(("cmul_rotary", ComplexRotary(), (torch.randn(2, 5, 8), torch.randn(5, 4, 2)), ["x", "freqs"]))
    jobs.append(("cmul_index_fp16", ComplexProduct("index").half(), (a.half(), b.half()), ["a", "b"]))
    for name, module, args, names in jobs:
        for dynamo in (False, True):
            if dynamo and ("fp16" in name or name.startswith("cmul_split") or name.endswith("conj")):
                continue  # keep the corpus small: dynamo for the plain forms
            file = f"{name}_{'dynamo_op18' if dynamo else 'ts_op17'}.onnx"
            path = os.path.join(OUT, file)
            try:
                torch.onnx.export(module, args, path, input_names=names, output_names=["out"], opset_version=18 if dynamo else 17,
                                  dynamo=dynamo, **({"optimize": True, "external_data": False} if dynamo else {}))
                record(file, made_by="torch.onnx dynamo" if dynamo else "torch.onnx TorchScript", what=module.__class__.__name__,
                       style=getattr(module, "style", "rotary"), conj=getattr(module, "conj", False))
            except Exception as e:  # noqa: BLE001
                print(f"FAILED {file}: {e}", file=sys.stderr)


def near_misses_complex():
    """Each breaks one precondition of complex-mul in the TorchScript index form."""
    base = "cmul_index_ts_op17.onnx"
    m = load(base)
    concat = first(m, "Concat")
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    save_near_miss(m, "nm_cmul_swapped_concat.onnx", base, "real and imaginary swapped in the Concat")

    m = load(base)
    add = first(m, "Add")
    add.op_type = "Sub"
    save_near_miss(m, "nm_cmul_wrong_sign.onnx", base, "im = ar*bi - ai*br (wrong sign)")

    m = load(base)
    for i in m.graph.input:
        i.type.tensor_type.shape.dim[2].dim_value = 3
    save_near_miss(m, "nm_cmul_last_axis_3.onnx", base, "a last axis of 3")

    m = load(base)
    gather = first(m, "Gather")
    set_const(m, gather.input[1], np.array([0], dtype=np.int64))
    save_near_miss(m, "nm_cmul_index_1d.onnx", base, "a Gather index of [0] (keeps the axis)")

    m = load(base)
    mul = first(m, "Mul")
    also_output(m, mul.output[0])
    save_near_miss(m, "nm_cmul_product_output.onnx", base, "a Mul output is also a graph output")

    m = load(base)
    gather = first(m, "Gather")
    set_int_attr(gather, "axis", 0)
    save_near_miss(m, "nm_cmul_gather_axis0.onnx", base, "a Gather on axis 0")


def testdata_models():
    """Every export and near-miss in testdata (folders included, fuzz
    regressions aside) as (name relative to testdata, model without its
    external data), in name order."""
    import glob
    for path in sorted(glob.glob(os.path.join(OUT, "*.onnx")) + glob.glob(os.path.join(OUT, "*", "*.onnx"))):
        name = os.path.relpath(path, OUT)
        if not name.startswith("fuzz"):
            yield name, onnx.load(path, load_external_data=False)


def onnx_shapes():
    """What ONNX's own shape inference (with data propagation) knows of every
    value of every model in testdata: testdata/shapes/NAME.json maps each
    value whose shape it infers to its dims (numbers, "$symbol", or null).
    tests/toolkit.rs holds onnx-fuse's shapes against them."""
    out_dir = os.path.join(OUT, "shapes")
    os.makedirs(out_dir, exist_ok=True)
    for name, model in testdata_models():
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        shapes = {}
        for v in inferred.graph.value_info:
            t = v.type.tensor_type
            if v.type.HasField("tensor_type") and t.HasField("shape"):
                shapes[v.name] = [d.dim_value if d.HasField("dim_value") else
                                  "$" + d.dim_param if d.HasField("dim_param") else None for d in t.shape.dim]
        with open(os.path.join(out_dir, name.replace("/", "__") + ".json"), "w") as f:
            json.dump(shapes, f, sort_keys=True, separators=(",", ":"))
            f.write("\n")


def ort_shapes():
    """What ONNX Runtime's symbolic shape inference (the analysis its
    transformers optimizer fuses by, run as that optimizer runs it, with
    auto_merge) derives for every value of every model in testdata:
    testdata/shapes/ort/NAME.json holds `shapes` (each value's dims: numbers,
    symbols or expressions as strings, or null) and `assumed` (each set of
    symbols it made one where they met in a broadcast: that holds only if
    none is 1, so it is no proof), or `failed` with the reason where the
    inference stopped. tests/toolkit.rs holds onnx-fuse's shapes against
    them."""
    import inspect
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    class Recording(SymbolicShapeInference):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.assumed = []

        def _add_suggested_merge(self, symbols, apply=False):
            # A merge is assumed where it comes from a broadcast: inside
            # _broadcast_shapes, a _check_merged_dims that allows broadcasts,
            # or the merge of an unknown broadcast output's axes.
            frames = inspect.stack()[1:6]
            broadcast = any(f.function == "_broadcast_shapes" for f in frames)
            caller = frames[0]
            if caller.function == "_check_merged_dims" and caller.frame.f_locals.get("allow_broadcast"):
                broadcast = True
            if caller.function == "_infer_impl":
                broadcast = True
            before = dict(self.suggested_merge_)
            super()._add_suggested_merge(symbols, apply)
            if broadcast:
                merged = sorted({str(s) for s in symbols} |
                                {str(v) for k, v in self.suggested_merge_.items() if before.get(k) != v})
                if len(merged) > 1 and merged not in self.assumed:
                    self.assumed.append(merged)

    def dims(t):
        return [d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                for d in t.shape.dim]

    out_dir = os.path.join(OUT, "shapes", "ort")
    os.makedirs(out_dir, exist_ok=True)
    for name, model in testdata_models():
        infer = Recording(2**31 - 1, True, False, 0)
        result = {}
        try:
            infer._preprocess(model)
            while infer.run_:
                infer._infer_impl()
            infer._update_output_from_vi()
            inferred = infer.out_mp_
            shapes = {}
            for v in list(inferred.graph.value_info) + list(inferred.graph.output):
                t = v.type.tensor_type
                if v.type.HasField("tensor_type") and t.HasField("shape"):
                    shapes[v.name] = dims(t)
            result = {"shapes": shapes, "assumed": infer.assumed}
        except Exception as e:  # noqa: BLE001 (the reason is the record)
            result = {"failed": f"{type(e).__name__}: {e}"}
        with open(os.path.join(out_dir, name.replace("/", "__") + ".json"), "w") as f:
            json.dump(result, f, sort_keys=True, separators=(",", ":"))
            f.write("\n")


def inputs_npz():
    """User-given inputs for verify: one 7-token row for the Llama export
    (its traced causal mask fixes the sequence length at 7)."""
    ids = np.array([[3, 14, 15, 9, 26, 53, 58]], dtype=np.int64)
    np.savez(os.path.join(OUT, "llama_inputs.npz"), input_ids=ids, attention_mask=np.ones_like(ids))
    np.savez(os.path.join(OUT, "llama_inputs_int32.npz"), input_ids=ids.astype(np.int32))
    record("llama_inputs.npz", made_by="numpy.savez", what="inputs for llama_ts_op14.onnx")
    record("llama_inputs_int32.npz", made_by="numpy.savez", what="input_ids of the wrong dtype (int32)")


def main():
    os.makedirs(OUT, exist_ok=True)
    use_mask_without_vmap()
    which = set(sys.argv[1:])

    def want(name):
        return not which or name in which

    jobs = [
        ("llama_ts_op14.onnx", lambda n: export_torch(n, "llama", opset=14)),
        ("llama_ts_op17_fp16.onnx", lambda n: export_torch(n, "llama", opset=17, fp16=True)),
        ("llama_dynamo_op18.onnx", lambda n: export_torch(n, "llama", opset=18, dynamo=True)),
        ("llama_sdpa_ts_op14.onnx", lambda n: export_torch(n, "llama", opset=14, attn="sdpa")),
        ("gemma_ts_op14.onnx", lambda n: export_torch(n, "gemma", opset=14)),
        ("gemma_ts_op17_fp16.onnx", lambda n: export_torch(n, "gemma", opset=17, fp16=True)),
        ("qwen2_dynamo_op18_fp16.onnx", lambda n: export_torch(n, "qwen2", opset=18, dynamo=True, fp16=True)),
        ("gpt2_ts_op14.onnx", lambda n: export_torch(n, "gpt2", opset=14)),
        ("gpt2_ts_op13_fp16.onnx", lambda n: export_torch(n, "gpt2", opset=13, fp16=True)),
        ("bert_ts_op14.onnx", lambda n: export_torch(n, "bert", opset=14)),
        ("t5_encoder_ts_op14.onnx", lambda n: export_torch(n, "t5", opset=14)),
        ("t5_encoder_ts_op17_fp16.onnx", lambda n: export_torch(n, "t5", opset=17, fp16=True)),
        ("whisper_encoder_ts_op14.onnx", lambda n: export_torch(n, "whisper", opset=14)),
        ("llama_optimum.onnx", lambda n: export_optimum(n, "llama", "text-generation", opset=14)),
        ("llama_optimum_past.onnx", lambda n: export_optimum(n, "llama", "text-generation-with-past", opset=14)),
        ("gpt2_sdpa_ts_op14.onnx", lambda n: export_torch(n, "gpt2", opset=14, attn="sdpa")),
        ("gpt2_dynamo_op18.onnx", lambda n: export_torch(n, "gpt2", opset=18, dynamo=True)),
        ("qwen2_ts_op14.onnx", lambda n: export_torch(n, "qwen2", opset=14)),
        ("mistral_sdpa_ts_op17.onnx", lambda n: export_torch(n, "mistral", opset=17, attn="sdpa")),
        ("gemma_sdpa_dynamo_op18.onnx", lambda n: export_torch(n, "gemma", opset=18, dynamo=True, attn="sdpa")),
        ("bert_sdpa_ts_op14.onnx", lambda n: export_torch(n, "bert", opset=14, attn="sdpa")),
        ("roberta_ts_op17.onnx", lambda n: export_torch(n, "roberta", opset=17)),
        ("vit_ts_op17.onnx", lambda n: export_torch(n, "vit", opset=17)),
        ("vit_ts_op17_fp16.onnx", lambda n: export_torch(n, "vit", opset=17, fp16=True)),
        ("trocr_decoder_ts_op14.onnx", lambda n: export_torch(n, "trocr", opset=14)),
        ("whisper_encoder_sdpa_ts_op17.onnx", lambda n: export_torch(n, "whisper", opset=17, attn="sdpa")),
        ("llama_ts_op12.onnx", lambda n: export_torch(n, "llama", opset=12)),
        ("t5_seq2seq_ts_op14.onnx", lambda n: export_t5_seq2seq(n, opset=14)),
        ("t5_optimum_decoder_past.onnx", lambda n: export_optimum(n, "t5", "text2text-generation-with-past",
                                                                   file="decoder_with_past_model.onnx")),
        ("gpt2_optimum_past.onnx", lambda n: export_optimum(n, "gpt2", "text-generation-with-past")),
        ("bert_optimum.onnx", lambda n: export_optimum(n, "bert", "feature-extraction", opset=14)),
        # Opset 23 (the portable target's RMSNormalization), eager attention, the
        # exporter's optimizer off so that the norms stay decomposed.
        ("llama_dynamo_op23.onnx", lambda n: export_torch(n, "llama", opset=23, dynamo=True, optimize=False)),
        ("gpt2_dynamo_op23.onnx", lambda n: export_torch(n, "gpt2", opset=23, dynamo=True, optimize=False)),
        # Unmasked cores at opset 23: the portable target's ONNX Attention.
        ("vit_dynamo_op23.onnx", lambda n: export_torch(n, "vit", opset=23, dynamo=True, optimize=False)),
        ("whisper_encoder_dynamo_op23.onnx",
         lambda n: export_torch(n, "whisper", opset=23, dynamo=True, optimize=False)),
        ("t5_optimum_folder", lambda n: export_optimum_folder(n, "t5", "text2text-generation-with-past", merged=False)),
        ("llama_optimum_merged_folder",
         lambda n: export_optimum_folder(n, "llama", "text-generation-with-past", merged=True)),
        # Merged branches whose attention reads the If's own output names
        # (present.N.value) directly.
        ("gpt2_optimum_merged_folder",
         lambda n: export_optimum_folder(n, "gpt2", "text-generation-with-past", merged=True)),
        ("mpnet_ts_op14.onnx", lambda n: export_torch(n, "mpnet", opset=14)),
        ("distilbert_ts_op14.onnx", lambda n: export_torch(n, "distilbert", opset=14)),
        ("modernbert_ts_op14.onnx", lambda n: export_torch(n, "modernbert", opset=14)),
        ("opt_ts_op14.onnx", lambda n: export_torch(n, "opt", opset=14)),
        ("bloom_ts_op14.onnx", lambda n: export_torch(n, "bloom", opset=14)),
        ("mpt_ts_op14.onnx", lambda n: export_torch(n, "mpt", opset=14)),
        ("olmo_ts_op14.onnx", lambda n: export_torch(n, "olmo", opset=14)),
        ("gemma2_ts_op18.onnx", lambda n: export_torch(n, "gemma2", opset=18)),
        ("deberta_ts_op14.onnx", lambda n: export_torch(n, "deberta", opset=14)),
        ("ln_axes_ts_op14.onnx", lambda n: export_feature_map_norms(n, opset=14)),
        ("mha_ts_op17.onnx", lambda n: export_multihead_encoder(n, opset=17)),
        ("xlnet_ts_op14.onnx", lambda n: export_torch(n, "xlnet", opset=14)),
        ("sew_ts_op17.onnx", lambda n: export_torch(n, "sew", opset=17)),
        ("hubert_ts_op17.onnx", lambda n: export_torch(n, "hubert", opset=17)),
        ("dinov2_ts_op17.onnx", lambda n: export_torch(n, "dinov2", opset=17)),
        ("neox_ts_op17.onnx", lambda n: export_torch(n, "neox", opset=17)),
        ("gptj_ts_op17.onnx", lambda n: export_torch(n, "gptj", opset=17)),
        # GPT-J with its cache: the present key Cast to float, the causal
        # mask sized by the attention mask and sliced at the key's length.
        ("gptj_optimum_past.onnx", lambda n: export_optimum(n, "gptj", "text-generation-with-past")),
        ("cohere_optimum_past.onnx", lambda n: export_optimum(n, "cohere", "text-generation-with-past")),
        ("glm_optimum_past.onnx", lambda n: export_optimum(n, "glm", "text-generation-with-past")),
        # Optimum's f16 export keeps the residual stream in f32: each norm
        # computes in f32 and casts to f16 before its weight.
        ("llama_optimum_past_fp16.onnx",
         lambda n: export_optimum(n, "llama", "text-generation-with-past", fp16=True)),
        ("qwen3_optimum_past.onnx", lambda n: export_optimum(n, "qwen3", "text-generation-with-past")),
        ("gpt_oss_optimum_past.onnx", lambda n: export_optimum(n, "gpt_oss", "text-generation-with-past")),
        ("esm_optimum.onnx", lambda n: export_optimum(n, "esm", "feature-extraction")),
        ("convbert_ts_op14.onnx", lambda n: export_torch(n, "convbert", opset=14)),
        ("funnel_ts_op14.onnx", lambda n: export_torch(n, "funnel", opset=14)),
        ("longt5_ts_op17.onnx", lambda n: export_torch(n, "longt5", opset=17)),
        ("mobilevit_ts_op14.onnx", lambda n: export_torch(n, "mobilevit", opset=14)),
        ("swin_hw_ts_op14.onnx", lambda n: export_torch(n, "swin", opset=14)),
        # Height, width and channels dynamic, as Optimum exports vision models:
        # the patch count floor(h/8)·floor(w/8) plus the class token meets 5
        # position embeddings, so it is 5 (it is never 1).
        ("vit_hw_ts_op14.onnx", lambda n: export_torch(n, "vit", opset=14, axes={
            "pixel_values": {0: "batch", 1: "channels", 2: "height", 3: "width"}})),
        # 3-D scores viewed as 4-D once, against a 4-D v.
        ("bloom_dynamo_op18.onnx", lambda n: export_torch(n, "bloom", opset=18, dynamo=True)),
        # SDPA as torch's dynamo exporter decomposes it: the key's transpose
        # folded into the batch and viewed back.
        ("bert_sdpa_dynamo_op18.onnx", lambda n: export_torch(n, "bert", opset=18, dynamo=True, attn="sdpa")),
        ("opt_optimum.onnx", lambda n: export_optimum(n, "opt", "text-generation", opset=14)),
        ("bloom_optimum.onnx", lambda n: export_optimum(n, "bloom", "text-generation", opset=14)),
        # BLOOM with its cache: ALiBi sized from the attention mask, whose
        # declared length "past_sequence_length + sequence_length" is a name
        # of its own, broadcast with the keys the cache's Concat counts.
        ("bloom_optimum_past.onnx", lambda n: export_optimum(n, "bloom", "text-generation-with-past", opset=14)),
    ]
    for name, job in jobs:
        if want(name):
            try:
                job(name)
            except Exception as e:  # keep going: report which exports failed
                print(f"FAILED {name}: {type(e).__name__}: {e}", file=sys.stderr)
    # The complex-product exports come before the near-misses made from them.
    if want("complex"):
        complex_exports()
    if want("near-misses"):
        near_misses_rms("llama_ts_op14.onnx")
        near_misses_ln("gpt2_ts_op14.onnx")
        near_misses_rms_op18("llama_dynamo_op18.onnx")
        subgraph_models()
        near_misses_attention()
        external_data_model("llama_ts_op14.onnx")
        complex_models()
        near_misses_complex()
        inputs_npz()
    if want("shapes"):
        onnx_shapes()
        ort_shapes()
    path = os.path.join(OUT, "MANIFEST.json")
    old = json.load(open(path)) if os.path.exists(path) else {}
    old.update(MANIFEST)
    with open(path, "w") as f:
        json.dump(dict(sorted(old.items())), f, indent=1, sort_keys=True, default=str)
        f.write("\n")


if __name__ == "__main__":
    main()
