"""Is this the machine I paid for? The host report: measured figures against expected ones, and a verdict.

``measure`` reads the host (disk, RAM, CPU cores, /dev/shm) from the agent itself; the GPU figures
(matmul TFLOP/s, host→device copy, PCIe link, throttle reasons) come from the GPU check's child
(``gpu.bench``), so the agent still never opens CUDA. ``datasheet`` holds what each card should do;
``judge`` compares and lists the shortfalls; HOST_CHECK decides whether they end the job.
"""
