"""`specdec audit`: a statistical test of whether a server's speculative mode is lossless."""
