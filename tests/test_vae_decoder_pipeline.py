"""The pipeline with the decoder's `decode_audio` false: latent chunks from the decoder, audio from
`vae_decoder` (per-stream state, sequence batching). tests/test_server.py's parity and release checks
run again here on such a server (this module's `server`), through a real tritonserver on the tiny
checkpoint (CPU)."""

import pytest

from tests.conftest import require_module

require_module("tritonclient", "tritonclient[all] in requirements.txt")

from tests.server import edited_repository, triton_server_factory  # noqa: E402,F401
from tests.test_decode_audio import executions  # noqa: E402
from tests.test_server import (  # noqa: E402,F401
    ckpt, first_audio_phases, metrics, offline, test_client_leaving_mid_stream_releases_kv_blocks_and_vae_state,
    test_concurrent_streams_each_equal_their_solo_result, test_http_generate_stream_sends_audio_events,
    test_reference_and_continuation_requests, test_stream_chunks_concatenate_to_the_whole_utterance_and_match_offline)


@pytest.fixture(scope="module")
def server(triton_server_factory, ckpt, tmp_path_factory):  # noqa: F811
    repo = edited_repository(tmp_path_factory.mktemp("vae_decoder_pipeline") / "repo",
                              parameters={"decoder": {"decode_audio": "false"}})
    return triton_server_factory(repo, env={"VOXCPM_CHECKPOINT": ckpt})


def test_first_audio_goes_through_vae_decoder(server):
    """Every phase of first audio takes time here, the vae phase too, and vae_decoder decodes."""
    before = executions(server, "vae_decoder")
    phases = first_audio_phases(server)
    assert phases["vae"] > 0, phases
    assert executions(server, "vae_decoder") > before
    m = metrics(server)  # no audio in the decoder to wait for
    assert m["voxcpm_engine_first_audio_fences_total"] == m["voxcpm_engine_first_audio_fence_misses_total"] == 0
