"""The cutover gate harness: the same OpenAI streaming client against skippy (batch-invariant
and not), the single-lane engine and llama-server (patched and stock), closed-loop and Poisson
load, vLLM's metric definitions, JSON + markdown + plots, and a gate that judges the results
(`python -m bench.gate --help`)."""
