# Source: https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/docs/debugging.md#L88 (Validate a 128-GPU configuration on a single GPU)
# written by torchtitan's authors; copied unchanged below this header.
NGPU=128 COMM_MODE="fake_backend" MODULE=llama3 CONFIG=llama3_70b ./run_train.sh
