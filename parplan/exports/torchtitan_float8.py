"""torchao's Float8 training in a torchtitan 0.3.0 export.

0.3.0 makes linear layers Float8 only inside a model spec (``model_registry(flavor, converters=[
Float8LinearConverter.Config(...)])``, torchtitan/components/quantization/float8.py), which no command-line
option reaches, so a Float8 plan gets a config function of its own in the export's config registry: the
flavor's recipe with that model spec. Its converter takes ``recipe_name`` ``rowwise`` (default) or
``rowwise_with_gw_hp`` and ``filter_fqns``; the tensorwise recipe and FSDP2's float8 all-gather
(``enable_fsdp_float8_all_gather``) were torchtitan 0.2's ``[quantize.linear.float8]`` settings and are gone.
"""

from __future__ import annotations

#: parplan's precisions -> the recipe 0.3.0's ``Float8LinearConverter`` runs them with
RECIPES = {"fp8-torchao-rowwise": "rowwise"}

#: torchao's Float8 precisions 0.3.0 cannot run, and why
REFUSED = {
    "fp8-torchao": "torchao's tensorwise recipe was torchtitan 0.2's [quantize.linear.float8] default; 0.3.0's "
                   "Float8LinearConverter has the rowwise recipes only (plan fp8-torchao-rowwise)",
    "fp8-torchao-fsdp8": "FSDP2's float8 all-gather (enable_fsdp_float8_all_gather) was torchtitan 0.2's, with the "
                         "tensorwise recipe; 0.3.0 gathers in bf16 (plan fp8-torchao-rowwise)",
}

#: The output layer's module name in 0.3.0's llama3 model: left bf16 (parplan prices the matmul over
#: the vocabulary in bf16; torchtitan's own 405B recipe filters it the same way)
OUTPUT_FQN = "lm_head"


def function_name(base_config: str, precision: str) -> str:
    """The config function written for ``precision`` on top of ``base_config``."""
    return f"{base_config}_float8_{RECIPES[precision]}"


def function_text(flavor: str, base_config: str, base_written: bool, precision: str) -> str:
    """The config function (Python source) that trains ``flavor`` as ``base_config`` does, its linear
    layers Float8 under ``precision``'s recipe."""
    recipe = RECIPES[precision]
    base = base_config if base_written else f"_registry.{base_config}"
    return f'''

def {function_name(base_config, precision)}():
    """{base_config} with torchao Float8 linear layers ({recipe} recipe), the output layer in bf16."""
    config = {base}()
    config.model_spec = model_registry(
        "{flavor}",
        converters=[Float8LinearConverter.Config(recipe_name="{recipe}", filter_fqns=["{OUTPUT_FQN}"])],
    )
    return config
'''


#: The imports the Float8 functions need, added to the config module's own
IMPORTS = ("from torchtitan.components.quantization import Float8LinearConverter\n"
           "from torchtitan.models.llama3 import config_registry as _registry\n")
