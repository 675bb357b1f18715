"""Packing tokenized documents into fixed-length blocks: `Pack` (what to pack), the
documents' token counts kept in the index (`lengths`), the blocks a worker reads
(`packing`, on sampler.packing) and the packing itself (`packer`)."""
