"""formats.text_normalize (NORMALIZE) vs. the reference's voxcpm.utils.text_normalize.TextNormalizer."""

import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.reference import text_normalizer
from voxcpm_triton.checks import clean_text
from voxcpm_triton.formats import text_normalize
from voxcpm_triton.formats.text_normalize import NormalizationError, normalize, normalize_target

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENGLISH = [
    "Hello world.",
    "(A warm, gentle voice)Hello, I have 3 cats.",
    "I'm fine, don't worry.",
    "Dr. Smith met Mr. and Mrs. Jones in St. Louis.",
    "C++ and C# are languages; mail a@b.com or see http://example.com",
]
NUMBERS = [
    "I have 3 cats and 25 dogs.",
    "On the 1st, 2nd, 3rd and 21st of the month, 1,234,567 copies sold.",
    "The ratio is 3.14, it fell to -5 and rose 50%; add 3/4 cup.",
    "Room 404 in the 1990s; version 2.0.3 released.",
    "x-2 and 3-4",
    "①② and ١٢٣ apples",  # digits str.isdigit knows but \d does not
]
DATES = [
    "On March 5, 2024 at 10:30am we met.",
    "The deadline is 2024-01-05; it's 7:45 pm.",
    "今天是2024年3月5日，下午3点。",
    "2024/03/05 12:30:45",
]
CURRENCY = [
    "It costs $12.50, or €15.99, or £20.",
    "$1.5 million and 100 USD",
    "价格是100元，打8折，花了¥300，还有3.5亿元和2元3角。",
]
UNITS = [
    "He ran 5km in 20 min at 15 km/h; it weighs 12kg, and 3mph.",
    "The temperature is -5°C at 50% humidity.",
    "面积是3m²，体积5m³，√2≈1.414，3<5，气温25.5°C，零下10度。",
    "5公里，10kg，20%的人，第1名，比分是3:2。",
]
CHINESE = [
    "你好，世界！",
    "我有3只猫和25条狗。",
    "x-2 在 2-3之间",
    "550 + 320 = 870 千卡。",
    "（温柔的女声）今天天气很好。",
    "【注意】这是——测试，我的`代码`在这。",
    "你好 world 123",
    "他说：“你好”",
    "电话：13800138000",
]
MARKUP = [
    "# Title\n\n- item one\n- item 2\n[link](http://x.y) and <b>bold</b> ![img](a.png)",
    "```code\nblock```after",
    "😀 Great job 👍🏽",
    "1️⃣ first",
    "“quoted” text\twith a tab",
    "你好 😀 世界",
    "😀 你好 ab",
]
CASES = ENGLISH + NUMBERS + DATES + CURRENCY + UNITS + CHINESE + MARKUP


@pytest.fixture(scope="module")
def ref():
    return text_normalizer()


def ref_or_error(ref, text):
    try:
        return ref.normalize(text)
    except Exception as e:  # noqa: BLE001 - the reference fails on some inputs; so must we
        return ("error", type(e).__name__)


def ours_or_error(text):
    try:
        return normalize(text)
    except NormalizationError as e:
        return ("error", type(e.__cause__).__name__)


@pytest.mark.parametrize("text", CASES, ids=range(len(CASES)))
def test_parity(ref, text):
    want = ref.normalize(text)
    assert normalize(text) == want
    # What serving and the offline API normalise: the text after the reference's whitespace clean-up.
    assert normalize(clean_text(text)) == ref.normalize(clean_text(text))


def test_cases_are_normalised():
    """The list exercises the normaliser (not texts it leaves alone)."""
    assert [t for t in CASES if normalize(t) == t] == ["Hello world.", "I'm fine, don't worry.", "你好，世界！"]
    assert normalize("I paid $5 on 2024-01-05.") == "I paid five dollars on the fifth of january twenty twenty four."
    assert normalize("我有3只猫。") == "我有三只猫。"


def _random_texts(n, seed):
    rng = random.Random(seed)
    pieces = (list("abcXYZ0123456789 .,;:!?-+=*/%$€£¥°²³√≈<>()（）【】`#[]\n\t你好世界年月日点元个")
              + ["——", "😀", "km", "kg", "2024-01-05", "3.5", "10:30", " - ", "$5", "第", "**", "<b>", "](x)"])
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def test_random_parity(ref):
    texts = _random_texts(300, seed=20261124)
    diffs = [(t, ref_or_error(ref, t), ours_or_error(t)) for t in texts
             if ref_or_error(ref, t) != ours_or_error(t)]
    assert not diffs, diffs[:5]


def test_failures_are_clear_errors(ref):
    # wetext's English grammar cannot parse "²": the reference raises a bare AssertionError.
    assert ref_or_error(ref, "x² and 3²") == ("error", "AssertionError")
    with pytest.raises(NormalizationError, match="text normalisation failed: wetext.s English grammar cannot parse this text$"):
        normalize("x² and 3²")
    assert isinstance(NormalizationError("x"), ValueError)
    # Nothing left to speak: the reference would go on with an empty text.
    assert ref.normalize("😀") == "" and normalize("😀") == ""
    with pytest.raises(NormalizationError, match="nothing is left to speak"):
        normalize_target("😀 ")
    with pytest.raises(NormalizationError, match="nothing is left to speak"):
        normalize_target("👨\u200d👩\u200d👧")  # a joined emoji leaves its zero-width joiners
    with pytest.raises(NormalizationError, match="nothing is left to speak"):
        normalize_target("#\ufe0f\u20e3")  # a keycap leaves its variation selector and enclosing mark
    assert normalize_target("I have 3 cats.") == "I have three cats."
    with pytest.raises(TypeError):
        normalize(b"bytes")


def test_two_spaces_left_by_the_clean_up(ref):
    """wetext's English grammar fails on two spaces in a row, which the reference's own clean-up
    leaves where it drops an emoji or an image between words: the reference fails, we give what
    it gives for the text with those spaces squeezed."""
    for text, squeezed in (("Hello 😀 world, 3 times.", "Hello world, 3 times."),
                           ("See ![img](a.png) here", "See here")):
        assert ref_or_error(ref, text) == ("error", "AssertionError")
        assert normalize(text) == ref.normalize(squeezed)
    assert normalize("Hello 😀 world, 3 times.") == "Hello world, three times."


def test_built_once_per_process_and_thread_safe():
    texts = CASES * 3
    want = [normalize(t) for t in texts]
    instances, results, errors = set(), {}, []

    def work(i):
        try:
            instances.add(id(text_normalize.normalizer()))
            results[i] = [normalize(t) for t in texts[i::8]]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(instances) == 1
    for i in range(8):
        assert results[i] == want[i::8]


def test_offline_no_sockets_and_only_package_files(tmp_path):
    """A fresh process builds the normaliser and uses it without opening a socket, and every FST
    it loads lies inside the installed wetext package."""
    code = r"""
import json, sys
events, fsts = [], []
def hook(event, args):
    if event.startswith(("socket.", "urllib.", "http.", "ftplib.", "smtplib.")):
        events.append(event)
sys.addaudithook(hook)
import kaldifst  # wetext hands FST paths to kaldifst's C++ reader: record them
class Recording(kaldifst.TextNormalizer):
    def __init__(self, path):
        fsts.append(path)
        super().__init__(path)
kaldifst.TextNormalizer = Recording
read = kaldifst.StdVectorFst.read
kaldifst.StdVectorFst.read = staticmethod(lambda path: (fsts.append(path), read(path))[1])
sys.path.insert(0, sys.argv[1])
from voxcpm_triton.formats.text_normalize import normalize
out = [normalize(t) for t in ("I paid $5 on 2024-01-05.", "今天是2024年3月5日，花了¥300。")]
import wetext, os
print(json.dumps({"events": events, "fsts": fsts, "out": out,
                  "package": os.path.dirname(os.path.abspath(wetext.__file__))}))
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_proxy", "_PROXY"))}
    env["HOME"] = str(tmp_path)  # no user caches to fall back on
    p = subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "python_backend")], capture_output=True,
                       text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["events"] == []
    assert got["out"] == ["I paid five dollars on the fifth of january twenty twenty four.",
                          "今天是二零二四年三月五日，花了三百元。"]
    assert got["fsts"], "no FST loads were seen"
    package = os.path.realpath(got["package"])
    for path in got["fsts"]:
        real = os.path.realpath(path)
        assert real.startswith(package + os.sep) and real.endswith(".fst") and os.path.isfile(real), path


# --- the offline API -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(checkpoint_dirs):
    from voxcpm_triton import VoxCPM2

    return VoxCPM2.from_pretrained(checkpoint_dirs["real_shaped"], device="cpu", dtype="float32")


def test_offline_api_normalises_the_target_text_only(model, ref):
    text, prompt_text = "I have  3 cats\nand $5.", "He said 2 words."
    normalized = ref.normalize(clean_text(text))
    assert normalized == "I have three cats and five dollars."
    p = model.prepare_prompt(text, normalize=True)
    assert p.n_target_tokens == len(model.tokenizer(normalized))
    assert p.tokens.tolist()[:p.n_target_tokens] == model.tokenizer(normalized)
    assert model.prepare_prompt(text).n_target_tokens == len(model.tokenizer(clean_text(text)))
    # With a prompt, its transcript is left as it is (the reference normalises the target only).
    audio = np.zeros(16000, np.float32)
    p = model.prepare_prompt(text, prompt_text=prompt_text, prompt_audio=audio, prompt_sample_rate=16000,
                             normalize=True)
    want = model.tokenizer(prompt_text + normalized)
    assert p.tokens.tolist()[:len(want)] == want
    # generate_latents / generate take it too, and give what the normalised text gives.
    kw = dict(seed=3, min_len=3, max_len=3, inference_timesteps=2)
    lat = model.generate_latents(text, normalize=True, **kw)
    assert np.array_equal(lat.numpy(), model.generate_latents(normalized, **kw).numpy())
    assert not np.array_equal(lat.numpy(), model.generate_latents(text, **kw).numpy())
    wav = model.generate(text, normalize=True, retry_badcase=False, **kw)
    assert np.array_equal(wav, model.generate(normalized, retry_badcase=False, **kw))
    with pytest.raises(NormalizationError, match="nothing is left"):
        model.generate_latents("😀 😀", normalize=True, **kw)


def test_contract_normalize_input():
    from voxcpm_triton.serving import contract
    from voxcpm_triton.serving.triton_io import InputError

    text = {"TEXT": np.array([b"Hi 3."], dtype=object)}
    assert contract.parse(text).normalize is False
    assert contract.parse({**text, "NORMALIZE": np.array([True])}).normalize is True
    assert contract.parse({**text, "NORMALIZE": np.array([False])}).normalize is False
    with pytest.raises(InputError, match="NORMALIZE must be BOOL"):
        contract.parse({**text, "NORMALIZE": np.array([1], np.int32)})
    with pytest.raises(InputError, match="NORMALIZE must hold exactly one value"):
        contract.parse({**text, "NORMALIZE": np.array([True, True])})
