"""The cutover gate harness: the same OpenAI streaming client against skippy, the single-lane
engine and llama-server, closed-loop and Poisson load, vLLM's metric definitions, JSON +
markdown + plots, and a gate that judges the results (`python -m bench.gate --help`)."""
