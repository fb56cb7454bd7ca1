"""The hardware and the kernels: `specdec profile` (pass costs), `bench kernels`, prefill, long contexts,
`choose-path`."""
