#!/usr/bin/env bash
# Publishes Tessera's backlog per instance to CloudWatch for the target
# tracking policy in aws-target-tracking.json:
#   backlog per instance = queued tasks / running workers
# Run it every minute (cron or a systemd timer) where the AWS CLI and a
# Tessera token are available. Documented, not run by the test suite.
#
#   TESSERA_METRICS=http://coordinator:7879/metrics TESSERA_TOKEN=tsr_... \
#   ASG=tessera-workers scripts/autoscale/publish-backlog.sh
set -euo pipefail
: "${TESSERA_METRICS:?set TESSERA_METRICS to the coordinator's /metrics URL}"
: "${TESSERA_TOKEN:?set TESSERA_TOKEN to a token that may read /metrics}"
: "${ASG:?set ASG to the worker Auto Scaling group's name}"
page=$(curl -fsS -H "Authorization: Bearer $TESSERA_TOKEN" "$TESSERA_METRICS")
queued=$(awk '$1 == "tessera_tasks{state=\"queued\"}" {print $2}' <<<"$page")
workers=$(awk '$1 ~ /^tessera_workers\{state="(idle|busy)"\}$/ {n += $2} END {print n + 0}' <<<"$page")
# No worker yet: the whole queue is one instance's backlog, so the group scales out.
backlog=$(awk -v q="${queued:-0}" -v w="$workers" 'BEGIN {print (w > 0) ? q / w : q}')
# Scale-in protection while busy keeps the group from terminating a renderer:
#   aws autoscaling set-instance-protection --protected-from-scale-in ...
aws cloudwatch put-metric-data --namespace Tessera \
  --metric-name TesseraBacklogPerInstance --unit None --value "$backlog" \
  --dimensions "AutoScalingGroupName=$ASG"
echo "backlog per instance: $backlog (queued $queued, workers $workers)"
