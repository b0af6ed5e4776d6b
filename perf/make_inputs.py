#!/usr/bin/env python3
"""Writes the perf_analyzer --input-data JSON files in this folder.

    python perf/make_inputs.py            # regenerate (MIN_LENGTH = MAX_LENGTH = 100 variants)
    python perf/make_inputs.py --fixed 200

The same files serve `tts` and `tts_stream` (same inputs). Each entry is one
request; perf_analyzer sends them round-robin. Only TEXT and SEED are given
(plus MIN_LENGTH/MAX_LENGTH in the *_fixed<N> files); the other inputs are
optional in the model configs and are left out.
"""
import argparse
import json
import os

TEXTS = {
    # ~5 words
    "short": [
        "Hello, how are you today?",
        "The weather is lovely outside.",
        "Please turn left at the corner.",
    ],
    # ~20 words
    "medium": [
        "The quick brown fox jumps over the lazy dog, while the farmer watches quietly "
        "from the porch of his old house.",
        "Our next train to the city center departs from platform four in ten minutes, "
        "so please have your tickets ready.",
        "She opened the letter slowly, read the first line twice, and then smiled for "
        "the first time in many weeks.",
    ],
    # ~60 words
    "long": [
        "Text to speech systems have improved remarkably over the last few years. Modern models "
        "can capture the rhythm, emphasis and emotion of natural speech, and they can imitate a "
        "speaker from only a few seconds of reference audio. Serving them efficiently, however, "
        "remains a challenge, because every second of audio requires many sequential decoding steps "
        "on the accelerator.",
        "On the morning of the expedition, the team gathered at the foot of the mountain before "
        "sunrise. They checked their ropes, packed extra water and food, and studied the map one "
        "last time. The guide reminded everyone to stay close together on the narrow ridge, to "
        "drink often, and to turn back without hesitation if the weather changed.",
        "Welcome to the quarterly review. In this session we will look at the results of the last "
        "three months, discuss what went well and what did not, and agree on the priorities for the "
        "coming quarter. Please keep your questions until the end of each section, and feel free to "
        "add comments to the shared document while we talk.",
    ],
    # Chinese: short, medium, long
    "zh": [
        "你好，欢迎使用语音合成。",
        "今天天气很好，我们一起去公园散步吧，顺便看看湖边新开的花。",
        "语音合成技术近年来取得了长足的进步。现代模型不仅能够准确地朗读文字，还能模仿说话人的音色、"
        "语调和情感。只需要几秒钟的参考音频，就可以生成自然流畅的语音，这为有声读物、智能客服和辅助阅读带来了新的可能。",
    ],
}


def entry(text, seed, fixed=None):
    e = {
        "TEXT": {"content": [text], "shape": [1]},
        "SEED": {"content": [seed], "shape": [1]},
    }
    if fixed is not None:
        e["MIN_LENGTH"] = {"content": [fixed], "shape": [1]}
        e["MAX_LENGTH"] = {"content": [fixed], "shape": [1]}
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixed", type=int, default=100, help="MIN_LENGTH = MAX_LENGTH of the *_fixed<N> files")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    sets = dict(TEXTS)
    sets["mixed"] = [t for texts in TEXTS.values() for t in texts]
    for name, texts in sets.items():
        for fixed, suffix in ((None, ""), (args.fixed, f"_fixed{args.fixed}")):
            data = {"data": [entry(t, 1000 + i, fixed) for i, t in enumerate(texts)]}
            path = os.path.join(args.out, f"tts_{name}{suffix}.json")
            lines = [json.dumps(e, ensure_ascii=False) for e in data["data"]]
            with open(path, "w", encoding="utf-8") as f:
                f.write('{"data": [\n  ' + ",\n  ".join(lines) + "\n]}\n")
            print(path)


if __name__ == "__main__":
    main()
