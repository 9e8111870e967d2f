"""The process launcher of ``python -m tfdp.launch``, with no TensorFlow: the local cluster's
processes and their ``TF_CONFIG``, supervision, prefixed output, children's set-up, network
isolation and emulated hosts."""
