# both ran from the repository root with make.py and compile.sh in .ab/qreg/ (an ignored folder carried to the GPU
# machine), after `python3 .ab/qreg/make.py` wrote the copies there; export SWA_COMMIT=52d908f first
. bench/gpu_env.sh > /dev/null 2>&1; export PYTHONPATH=$PWD/.flashmla:$PYTHONPATH
# run1 (09:59Z)
bash .ab/qreg/compile.sh ws_q2 ws_q2d ws_q4 ws_qhalf mma_gather_q2 > $OUT/qreg_compile.log 2>&1
python3 bench/experiments/exp_ws_floor.py --out $OUT --reps 7 --cells 64:1152:16384:16384,128:1152:16384:16384,64:640:4096:16384,64:1152:16384:1048576 --extra ws_q2=.ab/qreg/ws_q2.py --extra mma_gather_q2=.ab/qreg/mma_gather_q2.py > $OUT/exp_ws_floor.log 2>&1
# run2 (10:01Z)
bash .ab/qreg/compile.sh ws_q4 mma_gather_q4 > $OUT/qreg_compile.log 2>&1
python3 bench/experiments/exp_ws_floor.py --out $OUT --reps 7 --cells 64:1152:16384:16384,128:1152:16384:16384,64:640:4096:16384,128:1152:16384:1048576 --extra ws_q4=.ab/qreg/ws_q4.py --extra mma_gather_q4=.ab/qreg/mma_gather_q4.py --extra ws_q2=.ab/qreg/ws_q2.py > $OUT/exp_ws_floor.log 2>&1
