"""The GPU harness: loading problems, capturing their op graph, running candidates in child
processes, correctness under the precision contract, timing and roofline. Used by the verifier
and profiler nodes and by ``egg bench``; knows nothing of the graph."""
