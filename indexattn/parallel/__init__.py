"""Parallel plans and strategies: which tensors shard over a head or a sequence index
(`shard`, `sequence`), the ring over blocks of keys (`ring`), torch.distributed's styles
(`distributed`, imported only when asked for), and moving a tensor between layouts
(`relayout`). Nothing here is imported by `import indexattn` but what needs no torch."""
