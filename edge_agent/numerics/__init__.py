"""The numerics: compressors, CAT selection, error feedback, the aggregation arithmetic
the engine and every replica share, robust rules, and the models. Pure: no I/O."""
