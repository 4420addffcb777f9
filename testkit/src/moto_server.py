"""Keelson's moto server: `python -c <this> -H HOST -p PORT`, i.e. `moto.server` with the fixes below,
each where moto differs from AWS's documented behaviour. Tests that need a fix assert it, so each one
has a test that fails without it.

1. Instances launched from a launch template carry the template's IAM instance profile.
   AWS: RunInstances with a LaunchTemplate (and every Auto Scaling launch from one) gives the instance
   the template's `IamInstanceProfile` (DescribeInstances shows `IamInstanceProfile.Arn`). moto drops
   it, so instances show none. Test: protokube/tests/node_join.rs
   `moto_instances_of_a_launch_template_carry_its_instance_profile` (the node-join server checks
   that a joining instance carries its group's profile).

2. A launch-template version created by CreateLaunchTemplateVersion keeps its `UserData` as moto's
   base64 type. AWS: every version of a template may carry user-data and an Auto Scaling group launches
   from whichever version it is configured with. moto 5.x wraps `UserData` only in CreateLaunchTemplate,
   so version 2 and later hold a plain string and every launch from them fails moto's own type check
   (an autoscaling group pinned to version 2 never gets an instance). Test:
   ops/tests/rolling_moto.rs `moto_launches_from_a_launch_template_version_with_user_data`.

3. A route whose target instance is gone is a blackhole. AWS: a route table entry whose target
   instance has stopped or terminated reports `State: blackhole` (DescribeRouteTables); the AWS
   cloud-controller-manager's route controller deletes blackhole routes and otherwise looks up the
   Node of every instance a route points at. moto reports every route `active`, so after a node is
   replaced the controller fails on the dead instance ("node with instanceID … not found") and never
   writes the new nodes' pod-CIDR routes. Test: tests/tests/moto_routes.rs
   `a_route_to_a_terminated_instance_is_a_blackhole`.

4. An Auto Scaling group registers an instance in its target groups once, when the instance enters
   service (or when the target group is attached), and detaching a target group deregisters only the
   instances still registered. AWS: the group adds a *new* instance to its target groups; a target
   deregistered since (by DeregisterTargets: Keelson's protokube takes its control plane out of the API
   target group until the local API server is ready) stays out when the group launches or terminates
   another instance. moto re-registers every instance of the group on every change of the group, so a
   control plane that took itself out is put back behind the load balancer by its neighbour's
   replacement, and DetachLoadBalancerTargetGroups fails (InvalidTarget) on a target already gone.
   Test: tests/tests/moto_target_groups.rs `an_instance_out_of_its_target_group_stays_out`.

5. SetDesiredCapacity keeps the group within its sizes, and TerminateInstanceInAutoScalingGroup with
   ShouldDecrementDesiredCapacity does not take a group below its minimum. AWS refuses both with a
   ValidationError ("New SetDesiredCapacity value 4 is above max value 3 for the AutoScalingGroup.";
   "Currently, desiredSize equals minSize (1). Terminating instance without replacement will violate
   group's min size constraint. ..."). moto accepts them and launches or removes instances beyond the
   group's sizes, so a cluster-autoscaler bug (or a wrong --nodes range) would pass unnoticed here.
   Test: tests/tests/moto_autoscaler.rs `moto_answers_the_calls_cluster_autoscaler_makes`.

6. DescribeScalingActivities lists the group's activities. AWS: every launch and termination of a
   group's instances is an activity (newest first, with its StatusCode); cluster-autoscaler's AWS
   provider reads them after a scale-up to learn whether the launch failed. moto answers an empty
   list always. Here a launch made by a capacity change is a "Launching a new EC2 instance: <id>"
   activity and a termination a "Terminating EC2 instance: <id>" one, both Successful (moto's
   launches and terminations complete at once). Test: tests/tests/moto_autoscaler.rs
   `moto_answers_the_calls_cluster_autoscaler_makes`.

7. Auto Scaling requests are handled one at a time. AWS acts on an Auto Scaling group's instances
   atomically: each instance terminated by TerminateInstanceInAutoScalingGroup without decrement gets
   exactly one replacement, however many terminations arrive together. moto's server runs every request
   on its own thread over models that are not thread-safe: two terminations in one group each rebuild
   the group's instance list from the same snapshot (one undoes the other), count the group short, and
   either launch an extra instance (a group of 3 ends with 4) or fail with HTTP 500. The rolling update
   terminates up to maxUnavailable instances at once, so its test saw a fourth instance in a group of
   three. A lock around every Auto Scaling action makes each one atomic, as AWS's are. Only Auto
   Scaling: one lock around the whole server made every request wait behind every other, and a
   control plane's volume attach (EC2 calls, polled) took 9-11 s instead of 2-5 s in selfheal.
   Test: tests/tests/moto_concurrent_terminations.rs `concurrent_terminations_replace_each_instance_once`.

8. A launch template's own tags stay out of its launch-template data. AWS: CreateLaunchTemplate's
   top-level `TagSpecifications` (ResourceType `launch-template`) tag the template itself;
   DescribeLaunchTemplateVersions returns in `LaunchTemplateData.TagSpecifications` only the
   specifications given in `LaunchTemplateData` (instance, volume, ...), the types a launch applies.
   moto appends the top-level ones to the version's data as well, so Terraform's AWS provider reads
   back a `tag_specifications { resource_type = "launch-template" }` block it never wrote and plans
   a new version of every launch template right after `terraform apply`. Test:
   cli/tests/terraform_moto.rs `moto_keeps_a_launch_templates_own_tags_out_of_its_data`.

9. A load balancer created without a `Scheme` is internet-facing. AWS: `Scheme` is optional in
   CreateLoadBalancer (ELBv2) and defaults to `internet-facing`; Terraform's AWS provider sends it only
   for `internal = true`. moto's handler passes the absent parameter on as `None`, over its own
   default, so DescribeLoadBalancers shows no scheme and `keelson apply` plans `scheme: -> internet-facing`
   on the API load balancer Terraform created. Test: cli/tests/terraform_moto.rs
   `moto_makes_a_load_balancer_without_a_scheme_internet_facing`.

10. Not a fix but a record: moto enforces no IAM, so when `KEELSON_MOTO_CALLS` names a file, every
   request moto serves is appended to it, one JSON object a line: `method`, `url` (raw, as sent),
   `headers` (the ones that say who signed the request and what it asks: `Authorization`,
   `X-Amz-Target`, `Content-Type`, `Host`) and `body` (only a form or JSON body of at most 1 MiB —
   the Query and JSON protocols carry their action and parameters there; S3 objects are never
   kept), with the body's `declared` Content-Length and the bytes `received` (fewer when the client
   went away mid-request: such a request was never served, see `Recorded::incomplete`). The IAM oracle (`testkit/src/moto_calls.rs`) checks each against the policy of the role
   whose credentials signed it. Through moto's own recording hook (`Recorder._record_request`,
   called for every request of every service before it is handled), under a lock, so lines of
   concurrent requests never interleave. Test: testkit/tests/moto_calls.rs.

11. Also a record: moto's STS hands out credentials for any `AssumeRoleWithWebIdentity` — it checks
   neither the token nor the role's trust. Every credential it issues that way is appended to the
   same file as `{"web_identity": {"access_key_id", "role_arn", "token"}}`, so the oracle can judge
   the token as STS would (signature against the issuer's published key set, issuer and audience
   against the role's IAM OIDC provider, the subject against the role's trust policy;
   `testkit/src/web_identity.rs`) and check the calls signed with that key against the role's
   policies. The request line of the same call is recorded by fix 10 as for any other.
"""
import io
import json
import os
import sys
import threading

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.models import Activity, AutoScalingBackend, FakeAutoScalingGroup
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult
from moto.core.utils import utcnow
from moto.core.types import Base64EncodedString
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.models.launch_templates import LaunchTemplate, LaunchTemplateBackend
from moto.ec2.models.route_tables import Route
from moto.ec2.utils import parse_user_data
from moto.elbv2.models import ELBv2Backend
from moto.moto_api._internal.recorder.models import Recorder

_run_instances = InstanceBackend.run_instances


def _run_instances_with_template_profile(self, image_id, count, user_data, security_group_names, **kwargs):
    reservation = _run_instances(self, image_id, count, user_data, security_group_names, **kwargs)
    template = kwargs.get("launch_template")
    explicit = kwargs.get("iam_instance_profile_name") or kwargs.get("iam_instance_profile_arn")
    if template and not explicit:
        profile = self._get_template_from_args(template).data.get("IamInstanceProfile") or {}
        name, arn = profile.get("Name"), profile.get("Arn")
        if name or arn:
            for instance in reservation.instances:
                if instance.id not in self.iam_instance_profile_associations:
                    self.associate_iam_instance_profile(
                        instance_id=instance.id, iam_instance_profile_name=name, iam_instance_profile_arn=arn
                    )
    return reservation


InstanceBackend.run_instances = _run_instances_with_template_profile

_create_version = LaunchTemplate.create_version


def _create_version_with_user_data(self, data, description):
    user_data = data.get("UserData")
    if user_data is not None and not isinstance(user_data, Base64EncodedString):
        data = dict(data, UserData=parse_user_data(user_data))
    return _create_version(self, data, description)


LaunchTemplate.create_version = _create_version_with_user_data

_create_launch_template = LaunchTemplateBackend.create_launch_template


def _create_launch_template_data_without_its_own_tags(self, name, description, template_data, tag_spec):
    specs = template_data.get("TagSpecifications")
    if specs:
        kept = [s for s in specs if s.get("ResourceType") != "launch-template"]
        template_data = dict(template_data, TagSpecifications=kept)
        if not kept:
            del template_data["TagSpecifications"]
    return _create_launch_template(self, name, description, template_data, tag_spec)


LaunchTemplateBackend.create_launch_template = _create_launch_template_data_without_its_own_tags

_create_load_balancer = ELBv2Backend.create_load_balancer


def _create_load_balancer_internet_facing_by_default(self, *args, **kwargs):
    if kwargs.get("scheme") is None:
        kwargs["scheme"] = "internet-facing"
    return _create_load_balancer(self, *args, **kwargs)


ELBv2Backend.create_load_balancer = _create_load_balancer_internet_facing_by_default


def _route_state(self):
    instance = self.instance
    if instance is not None and instance.state in ("stopped", "terminated", "shutting-down", "stopping"):
        return "blackhole"
    return "active"


Route.state = property(_route_state)



def _register_new_instances(self, group_name):
    group = self.autoscaling_groups[group_name]
    if not group.target_group_arns:
        return
    done = getattr(group, "keelson_registered", set())
    ids = {state.instance.id for state in group.instance_states}
    for tg in self.elbv2_backend.describe_target_groups(target_group_arns=group.target_group_arns, load_balancer_arn=None, names=None):
        new = sorted(i for i in ids if (tg.arn, i) not in done)
        if new:
            self.elbv2_backend.register_targets(tg.arn, [{"Id": i, "Port": tg.port} for i in new])
        done = {(arn, i) for (arn, i) in done if arn != tg.arn or i in ids} | {(tg.arn, i) for i in ids}
    group.keelson_registered = done


def _detach_target_groups(self, group_name, target_group_arns):
    group = self.autoscaling_groups[group_name]
    group.target_group_arns = [x for x in group.target_group_arns if x not in target_group_arns]
    ids = {state.instance.id for state in group.instance_states}
    for arn in target_group_arns:
        tg = self.elbv2_backend.target_groups.get(arn)
        registered = [{"Id": i} for i in ids if tg is not None and i in tg.targets]
        if registered:
            self.elbv2_backend.deregister_targets(arn, registered)
    group.keelson_registered = {(a, i) for (a, i) in getattr(group, "keelson_registered", set()) if a not in target_group_arns}


AutoScalingBackend.update_attached_target_groups = _register_new_instances
AutoScalingBackend.detach_load_balancer_target_groups = _detach_target_groups

def _record(group, activity):
    activity.status_code = "Successful"
    activity.progress = 100
    group.keelson_activities = [activity] + getattr(group, "keelson_activities", [])


_group_set_desired = FakeAutoScalingGroup.set_desired_capacity


def _set_desired_recording(self, new_capacity):
    before = {s.instance.id for s in getattr(self, "instance_states", [])}
    old = getattr(self, "desired_capacity", 0)
    _group_set_desired(self, new_capacity)
    after = {s.instance.id for s in self.instance_states}
    now = utcnow()
    for instance_id in sorted(after - before):
        cause = (f"At {now} an instance was started in response to a difference between desired and actual capacity, "
                 f"increasing the capacity from {old} to {self.desired_capacity}.")
        _record(self, Activity(f"Launching a new EC2 instance: {instance_id}", cause, self, start_time=now))
    for instance_id in sorted(before - after):
        cause = f"At {now} an instance was taken out of service in response to a difference between desired and actual capacity, shrinking the capacity from {old} to {self.desired_capacity}."
        _record(self, Activity(f"Terminating EC2 instance: {instance_id}", cause, self, start_time=now))


FakeAutoScalingGroup.set_desired_capacity = _set_desired_recording

_terminate_instance = AutoScalingBackend.terminate_instance


def _terminate_within_min(self, instance_id, should_decrement):
    for group in self.autoscaling_groups.values():
        if should_decrement and any(s.instance.id == instance_id for s in group.instance_states) and group.desired_capacity <= group.min_size:
            raise ValidationError(
                f"Currently, desiredSize equals minSize ({group.min_size}). Terminating instance without replacement will violate "
                "group's min size constraint. Either set shouldDecrementDesiredCapacity flag to false or lower group's min size."
            )
    activity = _terminate_instance(self, instance_id, should_decrement)
    _record(activity.auto_scaling_group, activity)
    return activity


AutoScalingBackend.terminate_instance = _terminate_within_min


def _set_desired_within_sizes(self):
    name = self._get_param("AutoScalingGroupName")
    desired = self._get_int_param("DesiredCapacity")
    group = self.autoscaling_backend.autoscaling_groups.get(name)
    if group is not None and desired is not None:
        if desired > group.max_size:
            raise ValidationError(f"New SetDesiredCapacity value {desired} is above max value {group.max_size} for the AutoScalingGroup.")
        if desired < group.min_size:
            raise ValidationError(f"New SetDesiredCapacity value {desired} is below min value {group.min_size} for the AutoScalingGroup.")
    return _response_set_desired(self)


_response_set_desired = AutoScalingResponse.set_desired_capacity
AutoScalingResponse.set_desired_capacity = _set_desired_within_sizes


def _describe_scaling_activities(self):
    name = self._get_param("AutoScalingGroupName")
    ids = set(self._get_param("ActivityIds", []) or [])
    activities = []
    for group in self.autoscaling_backend.autoscaling_groups.values():
        if name and group.name != name:
            continue
        activities.extend(a for a in getattr(group, "keelson_activities", []) if not ids or a.activity_id in ids)
    activities.sort(key=lambda a: a.start_time, reverse=True)
    return ActionResult({"Activities": activities})


AutoScalingResponse.describe_scaling_activities = _describe_scaling_activities


_autoscaling_action = AutoScalingResponse.call_action
_one_autoscaling_action_at_a_time = threading.Lock()


def _autoscaling_serialized(self):
    with _one_autoscaling_action_at_a_time:
        return _autoscaling_action(self)


AutoScalingResponse.call_action = _autoscaling_serialized


_calls_file = os.environ.get("KEELSON_MOTO_CALLS")
_calls_lock = threading.Lock()
_CALL_HEADERS = ("authorization", "x-amz-target", "content-type", "host")
_MAX_CALL_BODY = 1 << 20


def _record_call(self, request, body=None):
    if not _calls_file or request.path.startswith("/moto-api/"):
        return
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() in _CALL_HEADERS}
    kind = headers.get("content-type", "")
    text = ""
    record = {"method": request.method, "url": request.raw_url, "headers": headers}
    if "x-www-form-urlencoded" in kind or "json" in kind:
        try:
            size = int(request.headers.get("Content-Length", "0"))
        except ValueError:
            size = 0
        record["declared"] = size
        if 0 < size <= _MAX_CALL_BODY:
            raw = request.environ["wsgi.input"].read(size)
            request.environ["wsgi.input"] = io.BytesIO(raw)
            text = raw.decode("utf-8", "replace")
            record["received"] = len(raw)
    record["body"] = text
    line = json.dumps(record)
    with _calls_lock:
        with open(_calls_file, "a") as f:
            f.write(line + "\n")


Recorder._record_request = _record_call


from moto.sts.models import STSBackend
from moto.sts.responses import TokenResponse as _StsResponse

_web_identity = threading.local()
_assume_with_web_identity_response = _StsResponse.assume_role_with_web_identity
_assume_with_web_identity = STSBackend.assume_role_with_web_identity


def _web_identity_response(self):
    _web_identity.token = self._get_param("WebIdentityToken")
    try:
        return _assume_with_web_identity_response(self)
    finally:
        _web_identity.token = None


def _web_identity_recorded(self, **kwargs):
    role = _assume_with_web_identity(self, **kwargs)
    if _calls_file:
        issued = {"access_key_id": role.access_key_id, "role_arn": kwargs.get("role_arn"), "token": getattr(_web_identity, "token", None)}
        with _calls_lock:
            with open(_calls_file, "a") as f:
                f.write(json.dumps({"web_identity": issued}) + "\n")
    return role


_StsResponse.assume_role_with_web_identity = _web_identity_response
STSBackend.assume_role_with_web_identity = _web_identity_recorded


if __name__ == "__main__":
    from moto.server import main

    sys.argv[0] = "moto_server"
    main(sys.argv[1:])
