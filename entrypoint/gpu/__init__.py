"""GPU checks: the probe child that exercises every GPU, and the causes its evidence points to."""
