"""How many bytes a delta checkpoint saves: delta / full bytes per training step, by encoding.

    python benchmarks/bench_delta.py                      # the default run's model, 10 steps
    python benchmarks/bench_delta.py --model llama-100m   # a 134M-parameter Llama, fp32 and bf16

Each step is a real AdamW step (the default run's lr 1e-4, betas (0.9, 0.99), weight decay
0.01) on the causal-LM loss of random tokens; the model is written with ``save_pretrained``
and packed into the exact version file the origin publishes (``write_archive``). Each
consecutive pair of files is then encoded four ways, each as 4 MiB blocks and zstd level 3:

- ``xor-zstd``: XOR of the two files' bytes, zstd;
- ``xor4-zstd``: the same XOR with its bytes regrouped by place in the 4-byte word (what
  SHARDCAST publishes, ``swarmrl.shardcast.delta``);
- ``xor-bits-zstd``: the XOR regrouped by bit (bit k of every 4-byte word together), zstd;
- ``sparse-zstd``: the changed 4-byte words only (gap to the previous change as uint32,
  then the new word), zstd;
- ``prefix-zstd``: the new block zstd-compressed with the old block as its raw-content
  dictionary (long matches only where bytes are identical).

``bf16`` trains the same fp32 master weights and writes the checkpoint cast to bf16, as
a trainer that broadcasts bf16 weights would. The published encoding is also decoded
(``rebuild``) and checked bit-identical by BLAKE3.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import blake3
import numpy as np
import torch
import zstandard

from swarmrl.shardcast.archive import write_archive
from swarmrl.shardcast.delta import BLOCK_SIZE, DeltaManifest, encode, file_reader, rebuild
from swarmrl.shardcast.layout import Manifest, ShardInfo


def _blocks(new: bytes, old: bytes):
    for offset in range(0, len(new), BLOCK_SIZE):
        yield new[offset : offset + BLOCK_SIZE], old[offset : offset + BLOCK_SIZE]


def _xor(a: bytes, b: bytes) -> np.ndarray:
    x = np.frombuffer(a, np.uint8).copy()
    n = min(len(a), len(b))
    x[:n] ^= np.frombuffer(b, np.uint8, count=n)
    return x


def xor_zstd(new: bytes, old: bytes) -> int:
    c = zstandard.ZstdCompressor(level=3)
    return sum(len(c.compress(_xor(n, o).tobytes())) for n, o in _blocks(new, old))


def xor_bitplane_zstd(new: bytes, old: bytes) -> int:
    c = zstandard.ZstdCompressor(level=3)
    total = 0
    for n, o in _blocks(new, old):
        x = _xor(n, o)
        whole = len(x) // 4 * 4
        # bit k of every little-endian 32-bit word together: the planes above a float's
        # changed mantissa bits are all zero
        bits = np.unpackbits(x[:whole].reshape(-1, 4), axis=1, bitorder="little")
        total += len(c.compress(np.packbits(bits.T, axis=1).tobytes() + x[whole:].tobytes()))
    return total


def sparse_zstd(new: bytes, old: bytes) -> int:
    c = zstandard.ZstdCompressor(level=3)
    total = 0
    for n, o in _blocks(new, old):
        words = len(n) // 4
        a = np.frombuffer(n, np.uint32, count=words)
        b = np.frombuffer(o.ljust(len(n), b"\0"), np.uint32, count=words)
        changed = np.flatnonzero(a != b).astype(np.uint32)
        gaps = np.diff(changed, prepend=np.uint32(0)).astype(np.uint32)
        total += len(c.compress(gaps.tobytes() + a[changed].tobytes() + n[words * 4 :]))
    return total


def prefix_zstd(new: bytes, old: bytes) -> int:
    total = 0
    for n, o in _blocks(new, old):
        d = zstandard.ZstdCompressionDict(o, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        total += len(zstandard.ZstdCompressor(level=3, dict_data=d).compress(n))
    return total


def published(new_path: Path, old_path: Path, work: Path) -> tuple[int, float, float]:
    """The published encoding: delta bytes, encode and decode seconds; asserts bit-identity."""
    new_size, old_size = new_path.stat().st_size, old_path.stat().st_size
    out = io.BytesIO()
    t0 = time.perf_counter()
    frames = encode(file_reader(new_path), new_size, file_reader(old_path), old_size, out)
    encode_s = time.perf_counter() - t0
    delta = work / "delta.bin"
    delta.write_bytes(out.getvalue())
    digest = blake3.blake3(out.getvalue()).hexdigest()
    new_hash = blake3.blake3(new_path.read_bytes()).hexdigest()
    manifest = DeltaManifest(
        version=2,
        base=1,
        base_blake3=blake3.blake3(old_path.read_bytes()).hexdigest(),
        base_size=old_size,
        result_blake3=new_hash,
        result_size=new_size,
        block_size=BLOCK_SIZE,
        frames=tuple(frames),
        file=Manifest(2, sum(frames), sum(frames), digest, (ShardInfo(sum(frames), digest),)),
    )
    t0 = time.perf_counter()
    rebuilt = rebuild(old_path, delta, manifest, work / "rebuilt.tar")
    decode_s = time.perf_counter() - t0
    assert rebuilt == new_hash, "the rebuilt file differs from the full one"
    return sum(frames), encode_s, decode_s


def build_model(name: str):
    if name == "default":
        from swarmrl.checkpoints import load_policy
        from swarmrl.model.build import ensure_default_model

        model, _ = load_policy(ensure_default_model())
        return model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["default", "llama-100m"], default="default")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated fp32,bf16 (default: fp32 for the default model, both for llama-100m)",
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = build_model(args.model)
    dtypes = (args.dtypes or ("fp32" if args.model == "default" else "fp32,bf16")).split(",")
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    print(
        f"model {args.model}: {params / 1e6:.2f} M parameters; AdamW lr {args.lr}, {args.steps} steps"
    )
    encoders = {
        "xor-zstd": xor_zstd,
        "xor-bits-zstd": xor_bitplane_zstd,
        "sparse-zstd": sparse_zstd,
        "prefix-zstd": prefix_zstd,
    }
    ratios: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        previous: dict[str, Path] = {}

        def snapshot(step: int) -> dict[str, Path]:
            files = {}
            for dtype in dtypes:
                ckpt = work / f"{dtype}-{step}"
                state = {
                    k: (v.to(torch.bfloat16) if dtype == "bf16" else v).contiguous()
                    for k, v in model.state_dict().items()
                }
                model.save_pretrained(ckpt, state_dict=state)
                path = work / f"{dtype}-{step}.tar"
                with open(path, "wb") as f:
                    write_archive(ckpt, f)
                files[dtype] = path
            return files

        previous = snapshot(0)
        print(
            f"{'step':>4} {'dtype':>5} {'full MB':>9} "
            + " ".join(f"{e:>11}" for e in ["xor4-zstd", *encoders])
            + "  enc s  dec s  loss"
        )
        for step in range(1, args.steps + 1):
            tokens = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
            loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            current = snapshot(step)
            for dtype in dtypes:
                new_path, old_path = current[dtype], previous[dtype]
                full = new_path.stat().st_size
                size, enc_s, dec_s = published(new_path, old_path, work)
                new, old = new_path.read_bytes(), old_path.read_bytes()
                row = {"xor4-zstd": size / full}
                row.update({name: fn(new, old) / full for name, fn in encoders.items()})
                for name, ratio in row.items():
                    ratios.setdefault((dtype, name), []).append(ratio)
                print(
                    f"{step:>4} {dtype:>5} {full / 1e6:>9.2f} "
                    + " ".join(f"{row[e]:>11.4f}" for e in row)
                    + f" {enc_s:>6.2f} {dec_s:>6.2f}  {loss.item():.3f}",
                    flush=True,
                )
                old_path.unlink()
            previous = current
    print("median delta/full over the steps:")
    for (dtype, name), values in ratios.items():
        print(f"  {dtype:>5} {name:>11}: {statistics.median(values):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
