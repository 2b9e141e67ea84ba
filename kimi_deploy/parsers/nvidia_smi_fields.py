"""The field names ``nvidia-smi --query-gpu`` takes, as its ``--help-query-gpu`` lists them.

:data:`QUERY_GPU_FIELDS` is every name (and alias: ``"name" or "gpu_name"``) that the
``--help-query-gpu`` outputs of drivers 465.27, 590.48.01, 591.86 (Windows), 595.71.05, 610.57.04
and 610.62 (Windows) list, the captures in ``tests/parsers/fixtures/help_query_gpu_*.txt``
(``SOURCES.md`` there cites each); ``tests/parsers/test_nvidia_smi_fields.py`` holds this table to
them. Drivers add names from branch to branch and seldom drop one, so the union of an old and the
newest branches knows the names of those between; the header detection of
:mod:`~kimi_deploy.parsers.nvidia_smi_query` also keeps a name it does not know.
"""

from __future__ import annotations

QUERY_GPU_FIELDS = frozenset(
    """
    accounting.buffer_size accounting.mode addressing_mode bbx.time_run c2c.mode
    clocks.applications.gr clocks.applications.graphics clocks.applications.mem
    clocks.applications.memory clocks.current.graphics clocks.current.memory clocks.current.sm
    clocks.current.video clocks.default_applications.gr clocks.default_applications.graphics
    clocks.default_applications.mem clocks.default_applications.memory clocks.gr clocks.max.gr
    clocks.max.graphics clocks.max.mem clocks.max.memory clocks.max.sm clocks.mem clocks.sm
    clocks.video clocks_event_reasons.active clocks_event_reasons.applications_clocks_setting
    clocks_event_reasons.gpu_idle clocks_event_reasons.hw_power_brake_slowdown
    clocks_event_reasons.hw_slowdown clocks_event_reasons.hw_thermal_slowdown
    clocks_event_reasons.supported clocks_event_reasons.sw_power_cap
    clocks_event_reasons.sw_thermal_slowdown clocks_event_reasons.sync_boost
    clocks_event_reasons_counters.hw_power_brake_slowdown
    clocks_event_reasons_counters.hw_thermal_slowdown clocks_event_reasons_counters.sw_power_cap
    clocks_event_reasons_counters.sw_thermal_slowdown clocks_event_reasons_counters.sync_boost
    clocks_throttle_reasons.active clocks_throttle_reasons.applications_clocks_setting
    clocks_throttle_reasons.gpu_idle clocks_throttle_reasons.hw_power_brake_slowdown
    clocks_throttle_reasons.hw_slowdown clocks_throttle_reasons.hw_thermal_slowdown
    clocks_throttle_reasons.supported clocks_throttle_reasons.sw_power_cap
    clocks_throttle_reasons.sw_thermal_slowdown clocks_throttle_reasons.sync_boost compute_cap
    compute_mode count display_active display_attached display_mode dramEncryption.mode.current
    dramEncryption.mode.pending driver_model.current driver_model.pending driver_version
    ecc.errors.corrected.aggregate.cbu ecc.errors.corrected.aggregate.device_memory
    ecc.errors.corrected.aggregate.dram ecc.errors.corrected.aggregate.l1_cache
    ecc.errors.corrected.aggregate.l2_cache ecc.errors.corrected.aggregate.register_file
    ecc.errors.corrected.aggregate.sram ecc.errors.corrected.aggregate.texture_memory
    ecc.errors.corrected.aggregate.total ecc.errors.corrected.volatile.cbu
    ecc.errors.corrected.volatile.device_memory ecc.errors.corrected.volatile.dram
    ecc.errors.corrected.volatile.l1_cache ecc.errors.corrected.volatile.l2_cache
    ecc.errors.corrected.volatile.register_file ecc.errors.corrected.volatile.sram
    ecc.errors.corrected.volatile.texture_memory ecc.errors.corrected.volatile.total
    ecc.errors.uncorrected.aggregate.cbu ecc.errors.uncorrected.aggregate.device_memory
    ecc.errors.uncorrected.aggregate.dram ecc.errors.uncorrected.aggregate.l1_cache
    ecc.errors.uncorrected.aggregate.l2_cache ecc.errors.uncorrected.aggregate.register_file
    ecc.errors.uncorrected.aggregate.sram ecc.errors.uncorrected.aggregate.sram.l2
    ecc.errors.uncorrected.aggregate.sram.mcu ecc.errors.uncorrected.aggregate.sram.other
    ecc.errors.uncorrected.aggregate.sram.parity ecc.errors.uncorrected.aggregate.sram.pcie
    ecc.errors.uncorrected.aggregate.sram.secded ecc.errors.uncorrected.aggregate.sram.sm
    ecc.errors.uncorrected.aggregate.sram.thresholdExceeded
    ecc.errors.uncorrected.aggregate.texture_memory ecc.errors.uncorrected.aggregate.total
    ecc.errors.uncorrected.volatile.cbu ecc.errors.uncorrected.volatile.device_memory
    ecc.errors.uncorrected.volatile.dram ecc.errors.uncorrected.volatile.l1_cache
    ecc.errors.uncorrected.volatile.l2_cache ecc.errors.uncorrected.volatile.register_file
    ecc.errors.uncorrected.volatile.sram ecc.errors.uncorrected.volatile.sram.parity
    ecc.errors.uncorrected.volatile.sram.secded ecc.errors.uncorrected.volatile.texture_memory
    ecc.errors.uncorrected.volatile.total ecc.mode.current ecc.mode.pending edpp_multiplier
    encoder.stats.averageFps encoder.stats.averageLatency encoder.stats.sessionCount
    enforced.power.limit fabric.cliqueId fabric.clusterUuid fabric.health.access_timeout_recovery
    fabric.health.bandwidth fabric.health.incorrect_configuration fabric.health.partition_assigned
    fabric.health.route_recovery_in_progress fabric.health.route_unhealthy fabric.health.summary
    fabric.state fabric.status fan.speed gom.current gom.pending gpu.base.current gpu.base.default
    gpu.base.max gpu.base.min gpu.base.requested gpu.power.current_limit gpu.power.default_limit
    gpu.power.draw.average gpu.power.draw.instant gpu.power.max_limit gpu.power.min_limit
    gpu.power.requested_limit gpu_bus_id gpu_name gpu_operation_mode.current
    gpu_operation_mode.pending gpu_recovery_action gpu_serial gpu_uuid gsp.mode.current
    gsp.mode.default hostname index inforom.checksum_validation inforom.ecc inforom.image
    inforom.img inforom.oem inforom.power inforom.pwr kmd_version memory.free memory.reserved
    memory.total memory.used mig.mode.current mig.mode.pending module.enforced.power.limit
    module.power.current_limit module.power.default_limit module.power.draw.average
    module.power.draw.instant module.power.limit module.power.max_limit module.power.min_limit
    module.power.requested_limit name pci.baseClass pci.bus pci.bus_id pci.device pci.device_id
    pci.domain pci.subClass pci.sub_device_id pcie.link.gen.current pcie.link.gen.gpucurrent
    pcie.link.gen.gpumax pcie.link.gen.hostmax pcie.link.gen.max pcie.link.width.current
    pcie.link.width.max persistence_mode platform.chassis_serial_number platform.gpu_fabric_guid
    platform.host_id platform.module_id platform.peer_type platform.slot_number platform.tray_index
    power.default_limit power.draw power.draw.average power.draw.instant power.limit
    power.management power.max_limit power.min_limit power_smoothing.active_profile
    power_smoothing.admin_override.percent_tmp_floor
    power_smoothing.admin_override.primary_floor_act_offset
    power_smoothing.admin_override.primary_floor_act_window_multiplier
    power_smoothing.admin_override.primary_floor_tar_window_multiplier
    power_smoothing.admin_override.ramp_down_hysteresis
    power_smoothing.admin_override.ramp_down_rate power_smoothing.admin_override.ramp_up_rate
    power_smoothing.admin_override.secondary_power_floor
    power_smoothing.curr_profile.percent_tmp_floor
    power_smoothing.curr_profile.primary_floor_act_offset
    power_smoothing.curr_profile.primary_floor_act_window_multiplier
    power_smoothing.curr_profile.primary_floor_tar_window_multiplier
    power_smoothing.curr_profile.ramp_down_hysteresis power_smoothing.curr_profile.ramp_down_rate
    power_smoothing.curr_profile.ramp_up_rate power_smoothing.curr_profile.secondary_power_floor
    power_smoothing.delayed_power_smoothing_supported power_smoothing.enabled
    power_smoothing.hw_lifetime_remaining_percent power_smoothing.imm_ramp_down
    power_smoothing.max_percent_tmp_floor power_smoothing.min_percent_tmp_floor
    power_smoothing.min_primary_floor_activation_offset
    power_smoothing.min_primary_floor_activation_point power_smoothing.num_preset_profiles
    power_smoothing.primary_power_floor power_smoothing.priv_level
    power_smoothing.secondary_power_floor power_smoothing.soc_power_smoothing_enabled
    power_smoothing.tmp_ceil power_smoothing.tmp_floor power_smoothing.window_multiplier
    protected_memory.free protected_memory.total protected_memory.used pstate
    remapped_rows.correctable remapped_rows.correctable_inactive remapped_rows.dbe
    remapped_rows.failure remapped_rows.histogram.high remapped_rows.histogram.low
    remapped_rows.histogram.max remapped_rows.histogram.none remapped_rows.histogram.partial
    remapped_rows.pending remapped_rows.sbe remapped_rows.uncorrectable
    remapped_rows.uncorrectable_inactive retired_pages.dbe retired_pages.double_bit.count
    retired_pages.pending retired_pages.sbe retired_pages.single_bit_ecc.count serial
    temperature.gpu temperature.gpu.tlimit temperature.memory timestamp utilization.decoder
    utilization.encoder utilization.gpu utilization.jpeg utilization.memory utilization.ofa uuid
    vbios_version vgpu_device_capability.fractional_multiVgpu
    vgpu_device_capability.heterogeneous_timeSlice_profile
    vgpu_device_capability.heterogeneous_timeSlice_sizes
    vgpu_device_capability.homogeneous_placements vgpu_device_capability.mig_timeSlicing
    vgpu_device_capability.mig_timeSlicing_mode vgpu_driver_capability.heterogenous_multivGPU
    """.split()  # noqa: SIM905 - a table of names, many to a line
)
