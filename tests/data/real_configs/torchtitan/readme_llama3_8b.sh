# Source: https://github.com/pytorch/torchtitan/blob/b5bcd76c66d0acb1a08b176d9639425bc55e0b2a/README.md#L151 (Start a training run: Llama 3 8B model locally on 8 GPUs)
# written by torchtitan's authors; copied unchanged below this header.
MODULE=llama3 CONFIG=llama3_8b ./run_train.sh
