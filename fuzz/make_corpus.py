#!/usr/bin/env python3
"""make_corpus.py - write the GGUF fuzzer's seed corpus (fuzz/corpus/gguf/*.gguf).

Small, valid files that exercise every part of the format the reader parses: all metadata value
types (including string arrays and a nested array), several tensor types and shapes, a non-default
alignment, and a vocabulary-like file. Standard library only. Run from the repository root:
    python3 fuzz/make_corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
FMT = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i", T_F32: "<f",
       T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == T_STR:
        return s(v)
    if t == T_ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        for it in items:
            out += value(et, it)
        return out
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, alignment=32, version=3):
    """kvs: [(key, type, value)]; tensors: [(name, shape, type_id, raw bytes)]"""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        head += s(k) + struct.pack("<I", t) + value(t, v)
    offs, data = [], b""
    for name, shape, ty, raw in tensors:
        offs.append(len(data))
        data += raw + b"\0" * ((-len(raw)) % alignment)
    for (name, shape, ty, raw), off in zip(tensors, offs):
        head += s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        head += struct.pack("<IQ", ty, off)
    if tensors:
        head += b"\0" * ((-len(head)) % alignment)
    return head + data


def f32s(n, scale=0.01):
    return b"".join(struct.pack("<f", (i % 17 - 8) * scale) for i in range(n))


def q8_0_blocks(nblocks):
    out = b""
    for b in range(nblocks):
        out += struct.pack("<e", 0.01 * (b + 1)) + bytes((i * 7 + b) % 256 for i in range(32))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {
        "tiny_f32_model.gguf": gguf(
            [("general.architecture", T_STR, "llama"), ("llama.embedding_length", T_U32, 8),
             ("llama.block_count", T_U32, 1)],
            [("token_embd.weight", [8, 4], 0, f32s(32)), ("output_norm.weight", [8], 0, f32s(8))]),
        "all_value_types.gguf": gguf(
            [("u8", T_U8, 200), ("i8", T_I8, -5), ("u16", T_U16, 60000), ("i16", T_I16, -300),
             ("u32", T_U32, 4000000000), ("i32", T_I32, -7), ("f32", T_F32, 1.5), ("bool", T_BOOL, True),
             ("str", T_STR, "hello"), ("u64", T_U64, 1 << 40), ("i64", T_I64, -(1 << 40)), ("f64", T_F64, 2.25),
             ("arr.i32", T_ARR, (T_I32, [1, -2, 3])), ("arr.str", T_ARR, (T_STR, ["a", "", "ccc"])),
             ("arr.nested", T_ARR, (T_ARR, [(T_U8, [1, 2]), (T_U8, [])])),
             ("arr.bool", T_ARR, (T_BOOL, [True, False]))],
            []),
        "vocab_like.gguf": gguf(
            [("general.architecture", T_STR, "llama"), ("tokenizer.ggml.model", T_STR, "llama"),
             ("tokenizer.ggml.tokens", T_ARR, (T_STR, ["<unk>", "<s>", "</s>", "\u2581a", "b", "<0x41>"])),
             ("tokenizer.ggml.scores", T_ARR, (T_F32, [0.0, 0.0, 0.0, -1.0, -2.0, 0.0])),
             ("tokenizer.ggml.token_type", T_ARR, (T_I32, [2, 3, 3, 1, 1, 6])),
             ("tokenizer.ggml.add_space_prefix", T_BOOL, True)],
            []),
        "alignment_64.gguf": gguf(
            [("general.alignment", T_U32, 64)],
            [("a", [4], 0, f32s(4)), ("b", [2, 3], 1, struct.pack("<6e", *[0.5] * 6))], alignment=64),
        "q8_0_tensor.gguf": gguf(
            [("general.architecture", T_STR, "gemma3")],
            [("blk.0.attn_v.weight", [64, 2], 8, q8_0_blocks(4)), ("x", [32, 1, 1, 2], 8, q8_0_blocks(2))]),
        "version2.gguf": gguf([("k", T_STR, "v2")], [("t", [3], 0, f32s(3))], version=2),
    }
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
