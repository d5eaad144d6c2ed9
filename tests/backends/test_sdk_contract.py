"""Every Tinker / Sail SDK call the production loop makes exists in the installed SDKs, with the keyword
arguments the loop passes. An SDK rename fails here, in CI, instead of in a user's paid run."""

from __future__ import annotations

import inspect

import sail
import tinker

from sailrl.runtime.backends.sail import tinker_rest_client_class

# (class, method, keyword arguments the loop (runtime/run.py) and runtime/backends/sail/ pass)
CALLS = [
    (tinker.ServiceClient, "create_lora_training_client_async",
     {"base_model", "rank", "seed", "train_mlp", "train_attn", "train_unembed"}),
    (tinker.ServiceClient, "create_training_client_from_state_with_optimizer_async", {"path"}),
    (tinker.ServiceClient, "create_sampling_client_async", {"model_path"}),
    (tinker.ServiceClient, "create_rest_client", set()),
    (tinker.TrainingClient, "forward_backward_async", {"data", "loss_fn", "loss_fn_config"}),
    (tinker.TrainingClient, "optim_step_async", set()),
    (tinker.TrainingClient, "save_weights_for_sampler_async", {"name", "ttl_seconds"}),
    (tinker.TrainingClient, "save_state_async", {"name", "ttl_seconds"}),
    (tinker.TrainingClient, "load_state_async", {"path"}),
    (tinker.TrainingClient, "get_tokenizer", set()),
    (tinker.SamplingClient, "sample_async", {"prompt", "num_samples", "sampling_params"}),
]


def test_tinker_methods_the_loop_calls_exist_with_those_parameters():
    for cls, name, kwargs in CALLS:
        method = getattr(cls, name, None)
        assert callable(method), f"tinker.{cls.__name__}.{name} is gone"
        params = set(inspect.signature(method).parameters)
        assert kwargs <= params, f"tinker.{cls.__name__}.{name} lost {kwargs - params}"


def test_sail_signs_checkpoint_urls_through_rest_methods_the_installed_tinker_has():
    rest = tinker_rest_client_class()
    source = inspect.getsource(sail.get_tinker_checkpoint_signed_url_async)
    for name in ("set_checkpoint_ttl_from_tinker_path_async", "get_checkpoint_archive_url_from_tinker_path_async"):
        assert name in source
        assert callable(getattr(rest, name, None)), f"tinker's RestClient has no {name}: pin tinker<0.36"


def test_sampling_params_and_adam_params_take_the_spec_values():
    sp = tinker.SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9, stop=["\n\nUser:"])
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.stop) == (12, 0.7, 0.9, ["\n\nUser:"])
    adam = tinker.AdamParams(learning_rate=1e-5, beta1=0.9, beta2=0.95, eps=1e-12)
    assert (adam.learning_rate, adam.beta1, adam.beta2, adam.eps) == (1e-5, 0.9, 0.95, 1e-12)


def test_sail_completer_takes_the_arguments_make_sail_policy_passes():
    params = set(inspect.signature(sail.SailTokenCompleter.__init__).parameters)
    assert {"model", "max_tokens", "temperature", "top_p", "completion_window", "tinker_lora_signed_url",
            "adapter_config", "tinker_lora_name"} <= params


def test_the_sail_sdk_helpers_the_adaptive_completer_reuses_exist():
    """runtime/backends/sail/completer.py builds the SDK's exact request and parses its answers with these sail.tinker
    helpers and constants; a sail release that renames one fails here."""
    import sail.inference
    import sail.tinker as sail_tinker

    for name in ("_model_input_to_tokens", "_normalize_stop", "_adapter_config_payload",
                 "_response_id_from_create_response", "_first_output_text", "_tokens_and_logprobs_from_response",
                 "_stop_reason_from_response"):
        assert callable(getattr(sail_tinker, name, None)), f"sail.tinker.{name} is gone"
    for name in ("_RAW_PROMPT_SENTINEL", "_RAW_PROMPT_TOKENS_FIELD", "_TINKER_ADAPTER_CONFIG_METADATA_FIELD",
                 "_TINKER_LORA_NAME_METADATA_FIELD", "_LOGPROBS_INCLUDE", "_DEFAULT_POLL_TIMEOUT_SECONDS"):
        assert isinstance(getattr(sail_tinker, name, None), str | float), f"sail.tinker.{name} is gone"
    for call in (sail.inference.responses.create, sail.inference.responses.retrieve):
        assert callable(getattr(call, "aio", None))
    assert {"voyage", "timeout"} <= set(inspect.signature(sail.inference.responses.retrieve.aio).parameters)
